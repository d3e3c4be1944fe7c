// The official @e2b/code-interpreter SDK, unmodified, against a real
// PandaStack server: run by TestNodeSDK and TestNodeSDKSplit
// (internal/controlplane/e2b), which set E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY. Its requests reach the code-interpreter template's code
// server on port 49999 of the guest through the server's port proxy
// (E2b-Sandbox-Port: 49999), so the server runs with sandbox networking.
// One sandbox, created as the SDK does by default (template
// code-interpreter-v1, which is PandaStack's code-interpreter).
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, NotFoundError, SandboxError, TimeoutError } from '@e2b/code-interpreter'

const slow = { requestTimeoutMs: 300_000 }
const tag = `code${process.pid}`
let sbx

before(async () => {
  // The world's first code-interpreter sandbox bakes the template (about
  // a minute under TCG): a longer wait than the other calls'.
  sbx = await Sandbox.create({ requestTimeoutMs: 900_000, timeoutMs: 900_000, metadata: { suite: tag } })
})

after(async () => {
  if (sbx) await sbx.kill().catch(() => {})
})

// run is runCode with the generous request timeout every call here needs
// under TCG.
const run = (code, opts = {}) => sbx.runCode(code, { ...slow, ...opts })

// refused is run for a cell the server is to refuse. The SDK's runCode
// clears its requestTimeoutMs timer only when the response is a success:
// after an error answer the timer stays pending, and it keeps this file's
// node process alive for the whole timeout (five minutes of `slow`)
// after its last test, the next file waiting for it (`node --test`
// runs one file at a time; --test-force-exit is Node 20.14's, Debian
// 12's is 18). So the SDK gets no timer here (requestTimeoutMs 0) and
// this one, which is cleared, bounds the call as `slow` does; if it
// fires, the caller's check of the error's class fails.
async function refused(code, opts = {}) {
  let timer
  const bound = new Promise((resolve, reject) => {
    timer = setTimeout(() => reject(new Error(`runCode not answered in ${slow.requestTimeoutMs} ms`)), slow.requestTimeoutMs)
  })
  try {
    return await Promise.race([sbx.runCode(code, { ...opts, requestTimeoutMs: 0 }), bound])
  } finally {
    clearTimeout(timer)
  }
}

// only returns the single result of an execution that has one.
function only(e) {
  assert.equal(e.error, undefined, `error: ${JSON.stringify(e.error)}`)
  assert.equal(e.results.length, 1, `results: ${JSON.stringify(e.results)}`)
  return e.results[0]
}

test('Sandbox.create() with no template is the code-interpreter template; connect gets its tokens', async () => {
  const info = await sbx.getInfo()
  assert.equal(info.templateId, 'code-interpreter')
  assert.equal(info.state, 'running')
  assert.ok(sbx.trafficAccessToken, 'create answered a traffic access token')
  const again = await Sandbox.connect(sbx.sandboxId, slow)
  assert.equal(again.trafficAccessToken, sbx.trafficAccessToken)
  assert.equal((await again.runCode('6 * 7', slow)).text, '42')
})

test('runCode: python keeps its state between cells', async () => {
  assert.deepEqual((await run('x = 41')).results, [])
  const e = await run('x + 1')
  assert.equal(e.text, '42')
  const r = only(e)
  assert.equal(r.isMainResult, true)
  assert.ok(Number.isInteger(e.executionCount) && e.executionCount > 1, `executionCount ${e.executionCount}`)
  assert.deepEqual(e.logs, { stdout: [], stderr: [] })
})

test('runCode: onStdout, onStderr and onResult as the cell runs', async () => {
  const out = [], errs = [], results = []
  const e = await run("import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\n'last'", {
    onStdout: (m) => out.push(m), onStderr: (m) => errs.push(m), onResult: (r) => results.push(r),
  })
  assert.equal(out.map((m) => m.line).join(''), 'to stdout\n')
  assert.equal(errs.map((m) => m.line).join(''), 'to stderr\n')
  assert.ok(out.every((m) => m.error === false) && errs.every((m) => m.error === true))
  assert.deepEqual(results.map((r) => r.text), ["'last'"])
  assert.equal(e.logs.stdout.join(''), 'to stdout\n')
  assert.equal(e.logs.stderr.join(''), 'to stderr\n')
})

test('results: png of a figure, html and data of a DataFrame, json', async () => {
  let e = await run('import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.show()')
  const fig = only(e)
  assert.equal(fig.isMainResult, false) // display_data
  assert.deepEqual([...Buffer.from(fig.png, 'base64').subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])

  e = await run("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
  const df = only(e)
  assert.equal(df.isMainResult, true)
  assert.match(df.html, /<table/)
  assert.match(df.text, /a\s+b/)
  assert.deepEqual(df.data, { a: [1, 2], b: [3, 4] })

  e = await run("from IPython.display import JSON\nJSON({'k': [1, 2], 's': 'v'})")
  assert.deepEqual(only(e).json, { k: [1, 2], s: 'v' })
})

test('errors: name, value and traceback; the context lives on', async () => {
  const e = await run('def f():\n    return 1 / 0\nf()')
  assert.equal(e.error.name, 'ZeroDivisionError')
  assert.equal(e.error.value, 'division by zero')
  assert.match(e.error.traceback, /ZeroDivisionError/)
  assert.ok(!e.error.traceback.includes('\x1b['), `colour codes in ${JSON.stringify(e.error.traceback)}`)
  assert.deepEqual(e.results, [])
  const syntax = await run('def (')
  assert.equal(syntax.error.name, 'SyntaxError')
  assert.equal((await run('x')).text, '41')
})

test('runCode: envs apply to that cell only', async () => {
  const code = "import os\nstr(os.environ.get('CELL_VAR'))"
  assert.equal((await run(code, { envs: { CELL_VAR: 'for this cell' } })).text, "'for this cell'")
  assert.equal((await run(code)).text, "'None'")
})

test('runCode: timeoutMs interrupts a long cell; the next runCode works', async () => {
  await assert.rejects(run('import time\nfor i in range(600):\n    progress = i\n    time.sleep(0.1)', { timeoutMs: 3000 }),
    (e) => e instanceof TimeoutError || (console.log(e), false))
  // Had the cell not been interrupted, this one would wait for it (cells
  // of a context run in turn) and see progress 599.
  const e = await run('progress')
  assert.ok(Number(e.text) < 599, `progress ${e.text}: the cell ran to its end`)
  assert.equal((await run('x')).text, '41')
})

test('code contexts: create with cwd, list, run in, remove', async () => {
  const ctx = await sbx.createCodeContext({ ...slow, cwd: '/tmp' })
  assert.match(ctx.id, /^[A-Za-z0-9_-]{1,64}$/)
  assert.equal(ctx.language, 'python')
  assert.equal(ctx.cwd, '/tmp')
  assert.equal((await run('import os\nos.getcwd()', { context: ctx })).text, "'/tmp'")
  await run('y = 5', { context: ctx })
  assert.equal((await run('y', { context: ctx })).text, '5')
  assert.equal((await run("'y' in globals()")).text, 'False', 'the default context is another interpreter')

  const listed = await sbx.listCodeContexts()
  const mine = listed.find((c) => c.id === ctx.id)
  assert.ok(mine, `${ctx.id} in ${JSON.stringify(listed)}`)
  assert.deepEqual([mine.language, mine.cwd], ['python', '/tmp'])
  assert.ok(listed.some((c) => c.id !== ctx.id && c.language === 'python'), 'the default python context is listed')

  await sbx.removeCodeContext(ctx.id)
  assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id), 'a removed context is not listed')
  await assert.rejects(refused('1', { context: ctx }), (e) => e instanceof NotFoundError || (console.log(e), false))
  await assert.rejects(sbx.removeCodeContext(ctx), (e) => e instanceof NotFoundError || (console.log(e), false))
  await assert.rejects(sbx.restartCodeContext(ctx), (e) => e instanceof NotFoundError || (console.log(e), false))
  await assert.rejects(sbx.createCodeContext({ ...slow, cwd: '/no/such/dir' }), (e) => e instanceof SandboxError || (console.log(e), false))
})

// A JavaScript context for the restart: a python one would start a
// second kernel, a minute under TCG.
test('code contexts: restart is a fresh interpreter with the same id, language and cwd', async () => {
  const ctx = await sbx.createCodeContext({ ...slow, language: 'js', cwd: '/tmp' })
  assert.equal(ctx.language, 'javascript')
  await run('var kept = 1', { context: ctx })
  assert.equal((await run('typeof kept', { context: ctx })).text, "'number'")
  await sbx.restartCodeContext(ctx)
  assert.equal((await run('typeof kept', { context: ctx })).text, "'undefined'")
  assert.equal((await run('process.cwd()', { context: ctx })).text, "'/tmp'")
  const again = (await sbx.listCodeContexts()).find((c) => c.id === ctx.id)
  assert.deepEqual([again?.language, again?.cwd], ['javascript', '/tmp'])
  await sbx.removeCodeContext(ctx)
})

test('language bash: output, state kept, a failing command', async () => {
  const bash = { language: 'bash' }
  let e = await run('echo hello $((6*7)); echo oops >&2', bash)
  assert.equal(e.logs.stdout.join(''), 'hello 42\n')
  assert.equal(e.logs.stderr.join(''), 'oops\n')
  assert.equal(e.error, undefined)
  await run('export KEPT=yes; cd /tmp', bash)
  e = await run('echo $KEPT $(pwd)', bash)
  assert.equal(e.logs.stdout.join(''), 'yes /tmp\n')
  e = await run('false', bash)
  assert.equal(e.error?.name, 'ExitError')
})

test('language js: top-level bindings kept, console output, the last value, promises', async () => {
  const js = { language: 'js' }
  assert.equal((await run('const base = 20; base + 22', js)).text, '42')
  const e = await run('console.log("base is", base); console.error("to stderr"); ({ a: [1, 2] })', js)
  assert.equal(e.logs.stdout.join(''), 'base is 20\n')
  assert.equal(e.logs.stderr.join(''), 'to stderr\n')
  assert.match(e.text, /a: \[ 1, 2 \]/)
  assert.equal((await run('Promise.resolve(base * 2)', js)).text, '40')
  const err = await run('null.x', js)
  assert.equal(err.error?.name, 'TypeError')
})

// chart returns the chart of the one figure a cell shows.
async function chart(code) {
  const e = await run(`import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\n${code}\nplt.show()`)
  const r = only(e)
  assert.ok(r.png, 'the figure is a png too')
  assert.ok(r.chart, `a chart in ${JSON.stringify(Object.keys(r.raw))}`)
  return r.chart
}

test('charts: line', async () => {
  const c = await chart("ax.plot([1, 2, 3], [2, 4, 6], label='double')\nax.plot([1, 2, 3], [1, 1, 1], label='flat')\n" +
    "ax.set_title('Lines')\nax.set_xlabel('x')\nax.set_ylabel('y')\nax.legend()")
  assert.equal(c.type, 'line')
  assert.equal(c.title, 'Lines')
  assert.deepEqual([c.x_label, c.y_label], ['x', 'y'])
  assert.deepEqual(c.elements.map((el) => el.label), ['double', 'flat'])
  assert.deepEqual(c.elements[0].points, [[1, 2], [2, 4], [3, 6]])
})

test('charts: bar', async () => {
  const c = await chart("ax.bar(['a', 'b', 'c'], [3, 5, 2], label='counts')\nax.set_title('Bars')")
  assert.equal(c.type, 'bar')
  assert.equal(c.title, 'Bars')
  assert.deepEqual(c.elements.map((el) => el.label), ['a', 'b', 'c'])
  assert.deepEqual(c.elements.map((el) => Number(el.value)), [3, 5, 2])
})

test('charts: scatter', async () => {
  const c = await chart("ax.scatter([1, 2, 3], [4, 5, 6], label='points')\nax.set_title('Dots')")
  assert.equal(c.type, 'scatter')
  assert.equal(c.title, 'Dots')
  assert.deepEqual(c.elements.map((el) => el.label), ['points'])
  assert.deepEqual(c.elements[0].points, [[1, 4], [2, 5], [3, 6]])
})

test('charts: pie', async () => {
  const c = await chart("ax.pie([1, 1, 2], labels=['x', 'y', 'z'])\nax.set_title('Pie')")
  assert.equal(c.type, 'pie')
  assert.equal(c.title, 'Pie')
  assert.deepEqual(c.elements.map((el) => el.label), ['x', 'y', 'z'])
  assert.deepEqual(c.elements.map((el) => Math.round(el.angle)), [90, 90, 180])
})

test('kill: the sandbox is gone and its code interpreter answers no more', async () => {
  assert.equal(await sbx.kill(), true)
  assert.equal(await sbx.kill(), false)
  await assert.rejects(refused('1'), (e) => e instanceof TimeoutError || e instanceof SandboxError || (console.log(e), false))
  await assert.rejects(sbx.listCodeContexts(), (e) => e instanceof TimeoutError || e instanceof SandboxError || (console.log(e), false))
  sbx = undefined
})
