// E2B's volumes with the official e2b SDK, unmodified, against a real
// `panda up` or `panda server`: run by TestNodeSDK and TestNodeSDKSplit
// (internal/controlplane/e2b), which set E2B_API_URL, E2B_SANDBOX_URL,
// E2B_VOLUME_API_URL and E2B_API_KEY.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, Volume, VolumeError, VolumeNotFoundError, VolumePathNotFoundError, VolumeFileType } from 'e2b'

const slow = { requestTimeoutMs: 300_000 }
const name = `vol${process.pid}`
let vol
let sbx

after(async () => {
  if (sbx) await sbx.kill().catch(() => {})
  if (vol) await Volume.destroy(vol.volumeId).catch(() => {})
})

test('Volume.create, connect, getInfo, list', async () => {
  vol = await Volume.create(name)
  assert.match(vol.volumeId, /^vol_[a-z0-9]{16}$/)
  assert.equal(vol.name, name)
  assert.ok(vol.token, 'create returns the volume content token')

  const info = await Volume.getInfo(vol.volumeId)
  assert.equal(info.volumeId, vol.volumeId)
  assert.equal(info.name, name)
  const again = await Volume.connect(vol.volumeId)
  assert.equal(again.name, name)
  assert.equal(again.volumeId, vol.volumeId)

  const all = await Volume.list()
  assert.ok(all.some((v) => v.volumeId === vol.volumeId && v.name === name), JSON.stringify(all))

  await assert.rejects(Volume.getInfo('vol_0000000000000000'), VolumeNotFoundError)
  await assert.rejects(Volume.create(name), VolumeError) // the name is taken
})

test('Volume files: writeFile, readFile, makeDir, list, getInfo, exists, remove', async () => {
  const w = await vol.writeFile('/dir/hello.txt', 'hello volume\n')
  assert.equal(w.type, VolumeFileType.FILE)
  assert.equal(w.name, 'hello.txt')
  assert.equal(w.size, 13)
  assert.ok(w.mtime instanceof Date && !Number.isNaN(w.mtime.getTime()))

  assert.equal(await vol.readFile('/dir/hello.txt'), 'hello volume\n')
  const bytes = await vol.readFile('dir/hello.txt', { format: 'bytes' })
  assert.equal(Buffer.from(bytes).toString(), 'hello volume\n')

  const d = await vol.makeDir('/dir/sub')
  assert.equal(d.type, VolumeFileType.DIRECTORY)
  const ls = await vol.list('/dir')
  assert.deepEqual(ls.map((e) => [e.name, e.type]), [['hello.txt', 'file'], ['sub', 'directory']])
  const deep = await vol.list('/', { depth: 2 })
  assert.ok(deep.some((e) => e.name === 'hello.txt'), JSON.stringify(deep))

  const st = await vol.getInfo('/dir/hello.txt')
  assert.equal(st.size, 13)
  assert.equal(await vol.exists('/dir/hello.txt'), true)
  assert.equal(await vol.exists('/dir/nope'), false)
  await assert.rejects(vol.readFile('/nope.txt'), VolumePathNotFoundError)

  await vol.writeFile('/gone.txt', 'x')
  await vol.remove('/gone.txt')
  assert.equal(await vol.exists('/gone.txt'), false)
  // Another token does not reach it.
  const stranger = new Volume(vol.volumeId, name, 'key_x.' + '0'.repeat(64))
  await assert.rejects(stranger.readFile('/dir/hello.txt'))
})

test('Sandbox.create({ volumeMounts }): the guest sees the volume; destroy', async () => {
  sbx = await Sandbox.create('base', { ...slow, timeoutMs: 300_000, volumeMounts: { '/mnt/data': vol } })
  const info = await sbx.getInfo()
  assert.deepEqual(info.volumeMounts, [{ name, path: '/mnt/data' }])

  const r = await sbx.commands.run('cat /mnt/data/dir/hello.txt', slow)
  assert.equal(r.stdout, 'hello volume\n')
  // A file the guest closed is there for the files API.
  await sbx.commands.run('echo from guest > /mnt/data/guest.txt', slow)
  assert.equal(await vol.readFile('/guest.txt'), 'from guest\n')

  // Not while a sandbox mounts it; a kill leaves the volume as it was.
  await assert.rejects(Volume.destroy(vol.volumeId), VolumeError)
  await sbx.kill()
  sbx = undefined
  assert.equal(await vol.readFile('/guest.txt'), 'from guest\n')

  const id = vol.volumeId
  assert.equal(await Volume.destroy(id), true)
  vol = undefined
  assert.equal(await Volume.destroy(id), false)
  await assert.rejects(Volume.getInfo(id), VolumeNotFoundError)
})
