// PandaStack's JavaScript context: one persistent Node.js process that
// evaluates each cell as a script in its own global context, so top-level
// let, const, var and function declarations persist from cell to cell.
//
// It talks to the code server over the socket whose descriptor is in
// PANDASTACK_DRIVER_FD, one JSON object per line:
//   server → driver  {"type":"execute","id":N,"code":"…","env":{…}}
//   driver → server  {"type":"ready"} once, then per cell, in order:
//                    {"type":"stdout"|"stderr","id":N,"text":"…"}
//                    {"type":"result","id":N,"text":"…"}   (util.inspect of
//                        the cell's value, when it is not undefined)
//                    {"type":"error","id":N,"name","value","traceback"}
//                    {"type":"done","id":N,"execution_count":K}
// console.* and process.stdout/stderr.write are sent over the socket, in
// order with results. A cell whose value is a Promise (or thenable) is
// awaited. SIGINT interrupts the running cell (vm's breakOnSigint while
// the script runs, a rejection while its promise is awaited); between
// cells it is ignored. A cell using top-level await is rewritten as
// Node's REPL does (internal/repl/await, with --expose-internals): its
// declarations are hoisted so they persist, the rest runs in an async
// function whose value is the last expression's.
'use strict';

const net = require('net');
const vm = require('vm');
const util = require('util');
const path = require('path');
const { Console } = require('console');
const { Writable } = require('stream');
const { createRequire } = require('module');

const fd = Number(process.env.PANDASTACK_DRIVER_FD);
delete process.env.PANDASTACK_DRIVER_FD;
const chan = new net.Socket({ fd, readable: true, writable: true });

let current = null; // the running cell's id
let count = 0;
let interruptCell = null; // rejects the awaited promise of the running cell

function send(msg) {
  chan.write(JSON.stringify(msg) + '\n');
}

function emit(type, chunk) {
  const text = typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString('utf8');
  if (text === '') return;
  const msg = { type, text };
  if (current !== null) msg.id = current;
  send(msg);
}

function sink(type) {
  return new Writable({
    write(chunk, _enc, cb) {
      emit(type, chunk);
      cb();
    },
  });
}

function patchWrite(stream, type) {
  stream.write = (chunk, enc, cb) => {
    emit(type, chunk);
    if (typeof enc === 'function') enc();
    else if (typeof cb === 'function') cb();
    return true;
  };
}

globalThis.console = new Console({ stdout: sink('stdout'), stderr: sink('stderr'), colorMode: false });
patchWrite(process.stdout, 'stdout');
patchWrite(process.stderr, 'stderr');
globalThis.require = createRequire(path.join(process.cwd(), '[cell]'));
globalThis.module = { exports: {} };
globalThis.exports = globalThis.module.exports;
globalThis.__dirname = process.cwd();
globalThis.__filename = path.join(process.cwd(), '[cell]');

process.on('SIGINT', () => {
  if (interruptCell !== null) {
    const reject = interruptCell;
    interruptCell = null;
    reject(new Error('Script execution interrupted.'));
  }
});
// Errors of callbacks that outlive their cell are reported, not fatal.
process.on('uncaughtException', (e) => emit('stderr', 'Uncaught ' + util.inspect(e) + '\n'));
process.on('unhandledRejection', (e) => emit('stderr', 'Unhandled rejection: ' + util.inspect(e) + '\n'));

function describe(e) {
  if (e !== null && typeof e === 'object' && typeof e.message === 'string') {
    return { name: String(e.name || 'Error'), value: e.message, traceback: String(e.stack || '') };
  }
  return { name: 'Error', value: util.inspect(e), traceback: '' };
}

let processTopLevelAwait = null;
try {
  ({ processTopLevelAwait } = require('internal/repl/await'));
} catch (_) {
  // Without --expose-internals: the plain async wrapper below.
}

// compile returns the cell's script and whether its value is wrapped
// ({value} from an async function: a cell with top-level await).
function compile(code, filename) {
  try {
    return { script: new vm.Script(code, { filename }), wrapped: false };
  } catch (e) {
    if (!(e instanceof SyntaxError) || !/\bawait\b/.test(code)) throw e;
    try {
      const rewritten = processTopLevelAwait !== null ? processTopLevelAwait(code) : null;
      if (rewritten !== null) return { script: new vm.Script(rewritten, { filename }), wrapped: true };
      return { script: new vm.Script('(async () => {\n' + code + '\n})()', { filename, lineOffset: -1 }), wrapped: false };
    } catch (_) {
      throw e; // the original error says more
    }
  }
}

function setEnv(env) {
  const saved = {};
  for (const [k, v] of Object.entries(env || {})) {
    saved[k] = Object.prototype.hasOwnProperty.call(process.env, k) ? process.env[k] : undefined;
    process.env[k] = v;
  }
  return saved;
}

function restoreEnv(saved) {
  for (const [k, v] of Object.entries(saved)) {
    if (v === undefined) delete process.env[k];
    else process.env[k] = v;
  }
}

async function run(msg) {
  const id = msg.id;
  current = id;
  count++;
  const saved = setEnv(msg.env);
  try {
    const { script, wrapped } = compile(String(msg.code), `cell-${count}.js`);
    let value = script.runInThisContext({ breakOnSigint: true, displayErrors: false });
    if (value !== null && (typeof value === 'object' || typeof value === 'function') && typeof value.then === 'function') {
      value = await new Promise((resolve, reject) => {
        interruptCell = reject;
        Promise.resolve(value).then(resolve, reject);
      });
      if (wrapped) value = value !== null && typeof value === 'object' ? value.value : undefined;
    }
    if (value !== undefined) {
      send({ type: 'result', id, text: util.inspect(value, { colors: false, depth: 6, maxArrayLength: 1000, maxStringLength: 1 << 20, breakLength: 100 }) });
    }
  } catch (e) {
    send({ type: 'error', id, ...describe(e) });
  } finally {
    interruptCell = null;
    restoreEnv(saved);
    current = null;
    send({ type: 'done', id, execution_count: count });
  }
}

let buf = '';
let chain = Promise.resolve();
chan.setEncoding('utf8');
chan.on('data', (data) => {
  buf += data;
  let nl;
  while ((nl = buf.indexOf('\n')) >= 0) {
    const line = buf.slice(0, nl);
    buf = buf.slice(nl + 1);
    let msg;
    try {
      msg = JSON.parse(line);
    } catch (_) {
      continue;
    }
    if (msg && msg.type === 'execute') chain = chain.then(() => run(msg));
  }
});
// The server is gone: nothing is left to serve.
chan.on('end', () => process.exit(0));
chan.on('error', () => process.exit(0));
send({ type: 'ready' });
