// Peer driver: runs the REAL Paperclip worker manager (@paperclipai/server 2026.916.1, installed
// by host/install-peer.sh) and lets another program drive it with NDJSON on stdin/stdout.
//
//   node host/peer-driver.mjs --peer-dir <dir> [--log-file <file>]
//   (or PAPERCLIP_PEER_DIR / PAPERCLIP_PEER_LOG)
//
// Commands (one JSON object per line on stdin), each answered by one line on stdout:
//   {"id":1,"op":"start","pluginId":"p","packageRoot":"/abs/checkout"}   (default: this repo)
//       optional: "manifestPath" (a manifest module instead of package.json's), "entrypointPath"
//       (spawn this instead of the manifest's worker), "env", "autoRestart", "config",
//       "firstCall": {"method","params"} (call it at once; the answer reports firstCallMs)
//   {"id":2,"op":"call","pluginId":"p","method":"health","params":{},"timeoutMs":30000}
//   {"id":3,"op":"notify","pluginId":"p","method":"...","params":{}}
//   {"id":4,"op":"stop","pluginId":"p"}
//   {"id":5,"op":"status"}
//   {"id":6,"op":"worker","pluginId":"p"}   (that worker's diagnostics(), or null)
// Login terminals and duplex channels, through the manager's own routes (docs/protocol.md H10.2-H10.3):
//   {"op":"loginOpen","pluginId":"p","driverKey","companyId","environmentId","providerLeaseId",
//    "loginCommandKey","sessionHome"}                -> {"session":"login-1"}  (manager.openLoginPtySession)
//   {"op":"duplexOpen","pluginId":"p","driverKey","companyId","environmentId","providerLeaseId",
//    "command":[...],"keepData":true}                -> {"session":"duplex-1"} (getWorker().openDuplexChannel)
//   {"op":"loginWrite","session","data":"text"}     (session.write(text), fire-and-forget like the host)
//   {"op":"duplexWrite","session","data":"<base64>","chunkBytes":262144,"drain":true,"timeoutMs"}
//       one session.write() per chunk; with drain, answers once the worker has answered every
//       pending request (the host bounds pending writes to 393,216 bytes per route)
//   {"op":"sessionRead","session","offset":0,"minBytes":N,"contains":"text","untilExit":false,"timeoutMs"}
//       what onData delivered (login: "text"; duplex: "data" in base64, from byte "offset"), once
//       minBytes / contains / untilExit holds, or the exit settled, or timeoutMs passed ("timedOut")
//   {"op":"sessionWait","session","timeoutMs"}      -> what wait() settled with
//   {"op":"sessionKill","session"} / {"op":"sessionClose","session"} (close() resolved; closeMs)
//   {"op":"gatewayArgv","shellCommand","remoteEntrypoint","nodeCommand","env":{}}
//       the host's own buildDuplexGatewayLaunchArgv (adapter-utils execution-target.js)
// Answers: {"id":N,"ok":true,"result":...} or {"id":N,"ok":false,"error":{"code":..,"message":..}}.
// A call's live output (onLog; environmentExecute with a companyId) streams first as
// {"id":N,"event":"log","stream":"stdout","chunk":"..."}; worker lifecycle changes arrive as
// {"event":"worker","pluginId":"p","type":"exit"|"crash"|"ready",...}.
// The manifest is loaded the way the host loads it (package.json -> paperclipPlugin.manifest ->
// dynamic import with ?mtime=, default export, the host's own validators), so a broken
// manifest.js fails here too. Host pino logs go to the log file, never to stdout.
import fs from "node:fs";
import path from "node:path";
import readline from "node:readline";
import { fileURLToPath, pathToFileURL } from "node:url";

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

function parseArgs(argv) {
  const out = {};
  for (let i = 0; i < argv.length; i += 1) {
    const arg = argv[i];
    if (arg === "--peer-dir") out.peerDir = argv[++i];
    else if (arg === "--log-file") out.logFile = argv[++i];
    else throw new Error(`unknown argument: ${arg}`);
  }
  return out;
}

const args = parseArgs(process.argv.slice(2));
const peerDir = path.resolve(args.peerDir ?? process.env.PAPERCLIP_PEER_DIR ?? path.join(repoRoot, ".cache/paperclip/peer"));
const logFile = path.resolve(args.logFile ?? process.env.PAPERCLIP_PEER_LOG ?? path.join(peerDir, "peer.log"));

// --- stdout discipline: protocol lines only -------------------------------------------------
// Protocol lines go out through the real process.stdout stream (non-blocking on a pipe): every
// emit() joins a queue that is written as one chunk per event-loop turn; while the pipe is full
// the queue waits for 'drain' (no EAGAIN spinning) and keeps collecting, in order. flushOut()
// resolves once everything emitted so far has reached the pipe.
const out = process.stdout;
const streamWrite = out.write; // the stream's own write, before the override below
const logFd = fs.openSync(logFile, "a");
let outQueue = [];
let outScheduled = false;
let outWaitingDrain = false;
let outBroken = false;
let outIdle = Promise.resolve(); // settles once the latest write has been handed to the pipe
let outWritten = () => {}; // settles outIdle

out.on("error", () => {
  // The reader is gone (EPIPE): drop output; closing stdin ends this process.
  outBroken = true;
  outQueue = [];
  outWritten();
});

function pumpOut() {
  outScheduled = false;
  if (outWaitingDrain || outBroken || outQueue.length === 0) return;
  const data = outQueue.length === 1 ? outQueue[0] : outQueue.join("");
  outQueue = [];
  let written = () => {};
  outIdle = new Promise((resolve) => {
    written = resolve;
  });
  outWritten = written;
  if (!streamWrite.call(out, data, "utf8", () => written())) {
    outWaitingDrain = true;
    out.once("drain", () => {
      outWaitingDrain = false;
      pumpOut();
    });
  }
}

function emit(message) {
  if (outBroken) return;
  outQueue.push(`${JSON.stringify(message)}\n`);
  if (!outScheduled && !outWaitingDrain) {
    outScheduled = true;
    setImmediate(pumpOut);
  }
}

async function flushOut() {
  for (;;) {
    if (outBroken) return;
    if (outQueue.length > 0 && !outWaitingDrain) pumpOut();
    const idle = outIdle;
    await idle;
    if (outQueue.length === 0 && idle === outIdle) return;
  }
}

function writeAllSync(fd, text) {
  const buffer = Buffer.from(text, "utf8");
  let offset = 0;
  while (offset < buffer.length) {
    offset += fs.writeSync(fd, buffer, offset, buffer.length - offset);
  }
}

// pino writes through a "tampered" process.stdout.write, so this sends every host log line
// (and any console.log) to the log file. Must happen before the server modules are imported.
process.stdout.write = (chunk, encoding, callback) => {
  writeAllSync(logFd, typeof chunk === "string" ? chunk : Buffer.from(chunk).toString("utf8"));
  const cb = typeof encoding === "function" ? encoding : callback;
  if (cb) cb();
  return true;
};
process.env.NODE_ENV = "production"; // JSON pino logs instead of the pretty transport on fd 1
process.env.PAPERCLIP_LOG_LEVEL ??= "debug";

// --- the real host modules --------------------------------------------------------------------
const services = path.join(peerDir, "node_modules/@paperclipai/server/dist/services");
const importService = (name) => import(pathToFileURL(path.join(services, name)).href);
const { createPluginWorkerManager } = await importService("plugin-worker-manager.js");
const { pluginManifestValidator } = await importService("plugin-manifest-validator.js");
const { pluginCapabilityValidator } = await importService("plugin-capability-validator.js");

const manager = createPluginWorkerManager();
const manifestValidator = pluginManifestValidator();
const capabilityValidator = pluginCapabilityValidator();

// Same resolution as the host's plugin-loader resolveManifestPath().
function resolveManifestPath(packageRoot, pkgJson) {
  const declared = pkgJson?.paperclipPlugin?.manifest;
  if (typeof declared === "string") return path.resolve(packageRoot, declared);
  for (const candidate of [path.join(packageRoot, "dist", "manifest.js"), path.join(packageRoot, "manifest.js")]) {
    if (fs.existsSync(candidate)) return candidate;
  }
  return null;
}

// Same as the host's loadManifestFromPath(): import with ?mtime=, default export, validate.
async function loadManifestModule(manifestPath) {
  let raw;
  try {
    const url = pathToFileURL(manifestPath);
    url.searchParams.set("mtime", String(Math.trunc(fs.statSync(manifestPath).mtimeMs)));
    const mod = await import(url.href);
    raw = mod.default ?? mod;
  } catch (err) {
    throw new Error(`Failed to load manifest module at ${manifestPath}: ${String(err)}`);
  }
  const manifest = manifestValidator.parseOrThrow(raw);
  if (!manifestValidator.getSupportedVersions().includes(manifest.apiVersion)) {
    throw new Error(`Plugin ${manifest.id} declares unsupported apiVersion ${manifest.apiVersion}`);
  }
  const caps = capabilityValidator.validateManifestCapabilities(manifest);
  if (!caps.allowed) {
    throw new Error(
      `Plugin ${manifest.id} manifest has inconsistent capabilities. ` +
        `Missing required capabilities for declared features: ${caps.missing.join(", ")}`,
    );
  }
  return manifest;
}

async function loadPlugin(cmd) {
  const packageRoot = path.resolve(cmd.packageRoot ?? repoRoot);
  const pkgJson = JSON.parse(fs.readFileSync(path.join(packageRoot, "package.json"), "utf8"));
  const manifestPath = cmd.manifestPath ? path.resolve(cmd.manifestPath) : resolveManifestPath(packageRoot, pkgJson);
  if (!manifestPath || !fs.existsSync(manifestPath)) {
    throw new Error(`Package at ${packageRoot} does not appear to be a Paperclip plugin (no manifest found)`);
  }
  const manifest = await loadManifestModule(manifestPath);
  let entrypointPath;
  if (cmd.entrypointPath) {
    entrypointPath = path.resolve(cmd.entrypointPath);
  } else {
    // Host rule (resolveWorkerEntrypoint): inside the package root and existing.
    entrypointPath = path.resolve(packageRoot, manifest.entrypoints.worker);
    if (!entrypointPath.startsWith(packageRoot) || !fs.existsSync(entrypointPath)) {
      throw new Error(`Worker entrypoint not found for plugin "${manifest.id}": ${entrypointPath}`);
    }
  }
  return { manifest, entrypointPath, packageName: pkgJson.name };
}

const handles = new Map();
const lastPids = new Map();

async function opStart(cmd) {
  const pluginId = cmd.pluginId ?? "createos-under-test";
  const { manifest, entrypointPath } = await loadPlugin(cmd);
  const started = performance.now();
  const handle = await manager.startWorker(pluginId, {
    entrypointPath,
    manifest,
    config: cmd.config ?? {},
    apiVersion: manifest.apiVersion,
    instanceInfo: {
      instanceId: "peer",
      hostVersion: "0.0.0",
      deploymentMode: "local_trusted",
      deploymentExposure: "private",
    },
    hostHandlers: { "config.get": async () => ({}) },
    env: {
      PAPERCLIP_DEPLOYMENT_MODE: "local_trusted",
      PAPERCLIP_DEPLOYMENT_EXPOSURE: "private",
      ...(cmd.env ?? {}),
    },
    autoRestart: cmd.autoRestart ?? true,
  });
  const startMs = performance.now() - started;
  // Optional: time to the first answered call (what a caller waiting on the worker sees).
  let firstCallMs = null;
  if (cmd.firstCall) {
    await manager.call(pluginId, cmd.firstCall.method, cmd.firstCall.params ?? {}, cmd.firstCall.timeoutMs);
    firstCallMs = performance.now() - started;
  }
  if (!handles.has(pluginId)) {
    // The pid reported with exit/crash is the process that ended; with ready, the new one.
    for (const type of ["exit", "crash", "ready"]) {
      handle.on(type, (payload) => {
        const { pluginId: _ignored, ...rest } = payload ?? {};
        if (type === "ready") lastPids.set(pluginId, handle.diagnostics().pid);
        emit({ event: "worker", pluginId, type, pid: lastPids.get(pluginId) ?? null, ...rest });
      });
    }
  }
  handles.set(pluginId, handle);
  lastPids.set(pluginId, handle.diagnostics().pid);
  return {
    pluginId,
    manifestId: manifest.id,
    entrypointPath,
    pid: handle.diagnostics().pid,
    supportedMethods: handle.supportedMethods,
    startMs,
    firstCallMs,
  };
}

async function opCall(cmd) {
  const onLog = (stream, chunk) => emit({ id: cmd.id, event: "log", stream, chunk });
  return manager.call(cmd.pluginId ?? "createos-under-test", cmd.method, cmd.params ?? {}, cmd.timeoutMs, onLog);
}

async function opNotify(cmd) {
  const handle = manager.getWorker(cmd.pluginId ?? "createos-under-test");
  if (!handle) throw new Error(`No worker registered for plugin "${cmd.pluginId}"`);
  handle.notify(cmd.method, cmd.params ?? {});
  return null;
}

async function opStop(cmd) {
  const pluginId = cmd.pluginId ?? "createos-under-test";
  const started = performance.now();
  await manager.stopWorker(pluginId);
  handles.delete(pluginId);
  return { pluginId, stopMs: performance.now() - started };
}

async function opStatus() {
  return { workers: manager.diagnostics(), peerDir, logFile };
}

async function opWorker(cmd) {
  const handle = manager.getWorker(cmd.pluginId ?? "createos-under-test");
  return handle ? handle.diagnostics() : null;
}

// --- login terminals and duplex channels ----------------------------------------------------
// Each open session is kept under a handle id with what its onData listener received and what
// its wait() settled with; reads and waits watch that record.
const sessions = new Map();
let sessionSeq = 0;

function newRecord(kind, pluginId, session, keepData) {
  sessionSeq += 1;
  const record = {
    id: `${kind}-${sessionSeq}`,
    kind,
    pluginId,
    session,
    keepData,
    chunks: [], // duplex: Buffers (kept when keepData); login: strings
    received: 0, // duplex: bytes; login: UTF-16 units
    deliveries: 0,
    exit: null,
    closed: false,
    watchers: new Set(),
  };
  const changed = () => {
    for (const watcher of [...record.watchers]) watcher();
  };
  record.changed = changed;
  session.onData((chunk) => {
    record.deliveries += 1;
    if (kind === "duplex") {
      record.received += chunk.byteLength;
      if (keepData) record.chunks.push(Buffer.from(chunk)); // a copy: the view is the host's
    } else {
      record.received += chunk.length;
      record.chunks.push(chunk);
    }
    changed();
  });
  session.wait().then((result) => {
    record.exit = result ?? null;
    changed();
  });
  sessions.set(record.id, record);
  return record;
}

function recordOf(cmd, kind) {
  const record = sessions.get(cmd.session);
  if (!record || (kind && record.kind !== kind)) throw new Error(`no ${kind ?? "session"} "${cmd.session}"`);
  return record;
}

// Resolves true once predicate() holds (checked now and after each change), false at timeoutMs.
function until(record, predicate, timeoutMs) {
  if (predicate()) return Promise.resolve(true);
  return new Promise((resolve) => {
    const done = (value) => {
      record.watchers.delete(watcher);
      clearTimeout(timer);
      resolve(value);
    };
    const watcher = () => {
      if (predicate()) done(true);
    };
    const timer = setTimeout(() => done(predicate()), timeoutMs ?? 30_000);
    record.watchers.add(watcher);
  });
}

function sessionTarget(cmd) {
  return {
    driverKey: cmd.driverKey ?? "createos",
    companyId: cmd.companyId,
    environmentId: cmd.environmentId,
    providerLeaseId: cmd.providerLeaseId,
  };
}

async function opLoginOpen(cmd) {
  const pluginId = cmd.pluginId ?? "createos-under-test";
  const started = performance.now();
  const session = await manager.openLoginPtySession(pluginId, {
    ...sessionTarget(cmd),
    loginCommandKey: cmd.loginCommandKey,
    sessionHome: cmd.sessionHome,
  });
  const record = newRecord("login", pluginId, session, true);
  return { session: record.id, openMs: performance.now() - started };
}

async function opDuplexOpen(cmd) {
  const pluginId = cmd.pluginId ?? "createos-under-test";
  const handle = manager.getWorker(pluginId);
  if (!handle) throw new Error(`No worker registered for plugin "${pluginId}"`);
  const started = performance.now();
  const session = await handle.openDuplexChannel({ ...sessionTarget(cmd), command: cmd.command });
  const record = newRecord("duplex", pluginId, session, cmd.keepData ?? true);
  return { session: record.id, openMs: performance.now() - started };
}

async function opLoginWrite(cmd) {
  recordOf(cmd, "login").session.write(String(cmd.data ?? ""));
  return null;
}

async function opDuplexWrite(cmd) {
  const record = recordOf(cmd, "duplex");
  const data = Buffer.from(cmd.data ?? "", "base64");
  const chunkBytes = Math.max(1, cmd.chunkBytes ?? 262_144);
  let writes = 0;
  for (let start = 0; start < data.length; start += chunkBytes) {
    record.session.write(new Uint8Array(data.subarray(start, start + chunkBytes)));
    writes += 1;
  }
  let drained = null;
  if (cmd.drain) {
    const handle = manager.getWorker(record.pluginId);
    const deadline = performance.now() + (cmd.timeoutMs ?? 30_000);
    drained = false;
    while (handle && performance.now() < deadline) {
      if (handle.diagnostics().pendingRequests === 0) {
        drained = true;
        break;
      }
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
  }
  return { bytes: data.length, writes, drained };
}

async function opSessionRead(cmd) {
  const record = recordOf(cmd);
  const offset = cmd.offset ?? 0;
  const wanted = () => {
    if (record.exit !== null || record.closed) return true;
    if (typeof cmd.minBytes === "number" && record.received < cmd.minBytes) return false;
    if (typeof cmd.contains === "string" && !record.chunks.join("").includes(cmd.contains)) return false;
    return !cmd.untilExit;
  };
  const met = await until(record, wanted, cmd.timeoutMs);
  const result = { received: record.received, deliveries: record.deliveries, exit: record.exit, timedOut: !met };
  if (record.kind === "login") {
    result.text = record.chunks.join("");
  } else {
    const all = record.chunks.length === 1 ? record.chunks[0] : Buffer.concat(record.chunks);
    record.chunks = all.length > 0 ? [all] : [];
    result.data = all.subarray(Math.min(offset, all.length)).toString("base64");
  }
  return result;
}

async function opSessionWait(cmd) {
  const record = recordOf(cmd);
  if (!(await until(record, () => record.exit !== null, cmd.timeoutMs))) {
    throw new Error(`${record.id}: wait() did not settle within ${cmd.timeoutMs ?? 30_000} ms`);
  }
  return record.exit;
}

async function opSessionKill(cmd) {
  recordOf(cmd).session.kill();
  return null;
}

async function opSessionClose(cmd) {
  const record = recordOf(cmd);
  const started = performance.now();
  await record.session.close();
  record.closed = true;
  record.changed();
  return { closeMs: performance.now() - started, exit: record.exit };
}

let gatewayModule = null;

async function opGatewayArgv(cmd) {
  gatewayModule ??= await import(
    pathToFileURL(path.join(peerDir, "node_modules/@paperclipai/adapter-utils/dist/execution-target.js")).href
  );
  return gatewayModule.buildDuplexGatewayLaunchArgv({
    shellCommand: cmd.shellCommand,
    remoteEntrypoint: cmd.remoteEntrypoint,
    nodeCommand: cmd.nodeCommand,
    env: cmd.env ?? {},
  });
}

const ops = {
  start: opStart,
  call: opCall,
  notify: opNotify,
  stop: opStop,
  status: opStatus,
  worker: opWorker,
  loginOpen: opLoginOpen,
  duplexOpen: opDuplexOpen,
  loginWrite: opLoginWrite,
  duplexWrite: opDuplexWrite,
  sessionRead: opSessionRead,
  sessionWait: opSessionWait,
  sessionKill: opSessionKill,
  sessionClose: opSessionClose,
  gatewayArgv: opGatewayArgv,
};

function errorOf(err) {
  const code = err && typeof err.code === "number" ? err.code : null;
  const message = err instanceof Error ? err.message : String(err);
  return { code, message };
}

async function run(cmd) {
  const op = ops[cmd.op];
  try {
    if (!op) throw new Error(`unknown op: ${cmd.op}`);
    const result = await op(cmd);
    emit({ id: cmd.id ?? null, ok: true, result: result ?? null });
  } catch (err) {
    emit({ id: cmd.id ?? null, ok: false, error: errorOf(err) });
  }
}

const pending = new Set();
const lines = readline.createInterface({ input: process.stdin });
lines.on("line", (line) => {
  if (!line.trim()) return;
  let cmd;
  try {
    cmd = JSON.parse(line);
  } catch (err) {
    emit({ id: null, ok: false, error: { code: null, message: `bad command line: ${err.message}` } });
    return;
  }
  const task = run(cmd).finally(() => pending.delete(task));
  pending.add(task);
});
lines.on("close", async () => {
  await manager.stopAll(); // pending calls fail once their worker exits
  await Promise.allSettled([...pending]);
  await flushOut(); // every answer and log line reaches the pipe before exit
  fs.closeSync(logFd);
  process.exit(0);
});
emit({ event: "ready", peerDir, logFile });
