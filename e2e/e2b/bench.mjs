// The E2B half of `panda bench exec`'s E2B comparison (internal/testing/bench,
// E2BBench): the official e2b SDK, unmodified, configured only by
// E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY.
//
// Protocol, one JSON object per line on stdout:
//   - on start: {"ready":true,"sdk_version":"…"}
//   - for each line "go" on stdin: Sandbox.create(BENCH_TEMPLATE) and
//     commands.run('true'), timed, then kill (not timed):
//     {"create_ms":…,"run_ms":…,"total_ms":…,"sandbox_id":"…","memory_mib":…}
//     or {"error":"…"}. memory_mib is asked (getInfo, untimed) only when
//     the line is "go info".
//   - EOF or "quit" ends it.
// Node's own start-up is therefore never measured. Sandboxes carry the
// metadata in BENCH_METADATA (JSON), so the Go side can clean them up.
import { createRequire } from 'node:module'
import { createInterface } from 'node:readline'
import { performance } from 'node:perf_hooks'
import { Sandbox } from 'e2b'

const require = createRequire(import.meta.url)
const template = process.env.BENCH_TEMPLATE || 'base'
const metadata = JSON.parse(process.env.BENCH_METADATA || '{}')
const opts = { requestTimeoutMs: 300_000 }

const say = (o) => process.stdout.write(JSON.stringify(o) + '\n')

say({ ready: true, sdk_version: require('e2b/package.json').version })

for await (const line of createInterface({ input: process.stdin })) {
  const cmd = line.trim()
  if (cmd === 'quit') break
  if (cmd !== 'go' && cmd !== 'go info') {
    say({ error: `unknown command ${JSON.stringify(cmd)}` })
    continue
  }
  let sbx
  try {
    const t0 = performance.now()
    sbx = await Sandbox.create(template, { ...opts, timeoutMs: 900_000, metadata })
    const t1 = performance.now()
    const r = await sbx.commands.run('true', opts)
    const t2 = performance.now()
    if (r.exitCode !== 0) throw new Error(`true exited ${r.exitCode}`)
    const out = { create_ms: t1 - t0, run_ms: t2 - t1, total_ms: t2 - t0, sandbox_id: sbx.sandboxId }
    if (cmd === 'go info') out.memory_mib = (await sbx.getInfo()).memoryMB
    await sbx.kill()
    sbx = undefined
    say(out)
  } catch (e) {
    if (sbx) await sbx.kill().catch(() => {})
    say({ error: String(e && e.stack ? e.stack : e) })
  }
}
