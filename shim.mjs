// Node shim: the Paperclip host forks this file (manifest entrypoints.worker) with a scrubbed
// environment. It starts the Python worker with the very stdio pipes the host opened, forwards
// SIGTERM/SIGINT, and exits with the worker's code. It never touches protocol data. Everything
// is resolved from import.meta.url: the host does not set our cwd.
//
// Three layouts, first match wins:
// - a source checkout after `make setup`: .venv/bin/python -m provider;
// - the npm package (python/bootstrap.py exists): python3 from PATH runs the bootstrap in
//   isolated mode with the runtime package npm installed for this platform (the compiled
//   dependencies, per CPython version); the bootstrap checks the version and fails clearly;
// - a checkout without .venv: python3 -m provider (dependencies installed some other way).
import { spawn } from "node:child_process";
import { accessSync, constants, existsSync, statSync } from "node:fs";
import { createRequire } from "node:module";
import { delimiter, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const packageDir = dirname(fileURLToPath(import.meta.url));
const NAME = "paperclip-plugin-createos";

// The fork IPC channel is unused: never let it keep the shim alive.
process.channel?.unref();

function isExecutableFile(candidate) {
  try {
    if (!statSync(candidate).isFile()) return false;
    accessSync(candidate, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

function onPath(names) {
  for (const name of names) {
    for (const dir of (process.env.PATH ?? "").split(delimiter)) {
      if (!dir) continue;
      const candidate = join(dir, name);
      if (isExecutableFile(candidate)) return candidate;
    }
  }
  return null;
}

// The runtime package's platform key, as the package names spell it.
function platformKey() {
  if (process.platform === "linux") {
    const musl = ["/lib/ld-musl-x86_64.so.1", "/lib/ld-musl-aarch64.so.1"].some(existsSync);
    return `linux-${process.arch}-${musl ? "musl" : "gnu"}`;
  }
  return `${process.platform}-${process.arch}`;
}

function runtimeDir(key) {
  try {
    const require = createRequire(import.meta.url);
    return dirname(require.resolve(`paperclip-createos-runtime-${key}/package.json`));
  } catch {
    return null;
  }
}

function plan() {
  const venvPython = join(packageDir, ".venv", "bin", "python");
  if (isExecutableFile(venvPython)) return { python: venvPython, args: ["-m", "provider"], env: {} };
  // python3 first (what operators install); versioned names when python3 is missing.
  const python = onPath(["python3", "python3.14", "python3.13", "python3.12", "python3.11"]);
  const bootstrap = join(packageDir, "python", "bootstrap.py");
  if (existsSync(bootstrap)) {
    if (python === null) {
      return {
        missing:
          "no Python found: the worker needs CPython 3.11 or newer (3.11 to 3.14 are shipped) " +
          "as python3 on the Paperclip server's PATH; install it on the server, then restart " +
          "the server or enable the plugin again",
      };
    }
    const key = platformKey();
    return {
      python,
      // Isolated (no user site, no PYTHON* variables), unbuffered, UTF-8 whatever the locale.
      args: ["-I", "-u", "-X", "utf8", bootstrap],
      env: { PAPERCLIP_CREATEOS_PLATFORM: key, PAPERCLIP_CREATEOS_RUNTIME: runtimeDir(key) ?? "" },
    };
  }
  if (python === null) {
    return {
      missing:
        "no Python found (looked for .venv/bin/python in the plugin folder and python3 on " +
        "PATH): this is a source checkout, set it up as its README's development section says",
    };
  }
  return { python, args: ["-m", "provider"], env: {} };
}

const start = plan();
if (start.missing !== undefined) {
  process.stderr.write(`${NAME}: ${start.missing}\n`);
  process.exit(127);
}
const python = start.python;

const child = spawn(python, start.args, {
  cwd: packageDir,
  stdio: "inherit",
  env: {
    ...process.env,
    ...start.env,
    PYTHONUNBUFFERED: "1",
    PYTHONUTF8: "1",
    PAPERCLIP_CREATEOS_SHIM_PID: String(process.pid),
  },
});

const forwarded = ["SIGTERM", "SIGINT"];
const forward = (signal) => {
  if (child.exitCode === null && child.signalCode === null) child.kill(signal);
};
for (const signal of forwarded) process.on(signal, forward);

child.on("error", (err) => {
  process.stderr.write(`${NAME}: cannot start ${python}: ${err.message}\n`);
  process.exit(127);
});

child.on("exit", (code, signal) => {
  if (signal !== null) {
    // Re-raise the worker's signal on ourselves so the host sees the same cause of death.
    for (const name of forwarded) process.removeListener(name, forward);
    process.kill(process.pid, signal);
    setTimeout(() => process.exit(1), 1000).unref();
    return;
  }
  process.exit(code ?? 1);
});
