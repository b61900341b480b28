// Point a Paperclip instance config at an external PostgreSQL and make it quiet and local:
//   node configure.mjs <config.json> <database-url> <port>
// database.mode "postgres" with that connection string and backups off, telemetry off, update
// checks off, server bound to 127.0.0.1:<port> (the server reads its port from here unless PORT
// is set). Every other setting test-drive chose is kept.
import { readFileSync, writeFileSync } from "node:fs";

const [file, connectionString, portText] = process.argv.slice(2);
const port = Number(portText);
if (!file || !connectionString || !Number.isInteger(port) || port < 1 || port > 65535) {
  process.stderr.write("usage: node configure.mjs <config.json> <database-url> <port>\n");
  process.exit(2);
}
const config = JSON.parse(readFileSync(file, "utf8"));
const database = config.database ?? {};
config.database = {
  ...database,
  mode: "postgres",
  connectionString,
  backup: { ...(database.backup ?? {}), enabled: false },
};
config.telemetry = { ...config.telemetry, enabled: false };
config.updates = { ...config.updates, checkEnabled: false };
config.server = { ...config.server, host: "127.0.0.1", port };
writeFileSync(file, JSON.stringify(config, null, 2) + "\n", { mode: 0o600 });
