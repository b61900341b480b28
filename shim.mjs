// Node shim: the Paperclip host forks this file (manifest entrypoints.worker) with a scrubbed
// environment. It starts the Python worker (`python -m provider`) with the very stdio pipes the
// host opened, forwards SIGTERM/SIGINT, and exits with the worker's code. It never touches
// protocol data. Everything is resolved from import.meta.url: the host does not set our cwd.
import { spawn } from "node:child_process";
import { accessSync, constants, statSync } from "node:fs";
import { delimiter, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const packageDir = dirname(fileURLToPath(import.meta.url));

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

function findPython() {
  const venvPython = join(packageDir, ".venv", "bin", "python");
  if (isExecutableFile(venvPython)) return venvPython;
  for (const dir of (process.env.PATH ?? "").split(delimiter)) {
    if (!dir) continue;
    const candidate = join(dir, "python3");
    if (isExecutableFile(candidate)) return candidate;
  }
  return null;
}

const python = findPython();
if (python === null) {
  process.stderr.write(
    "paperclip-plugin-createos: no Python found (looked for .venv/bin/python in the plugin folder and python3 on PATH)\n",
  );
  process.exit(127);
}

const child = spawn(python, ["-m", "provider"], {
  cwd: packageDir,
  stdio: "inherit",
  env: {
    ...process.env,
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
  process.stderr.write(`paperclip-plugin-createos: cannot start ${python}: ${err.message}\n`);
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
