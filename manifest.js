// Manifest loader for the Paperclip host: the host imports this module (a bare .json file cannot
// be imported), so it reads manifest.json beside it and default-exports the parsed object.
// new URL(..., import.meta.url) drops the host's ?mtime= cache-busting query.
import { readFileSync } from "node:fs";

const manifest = JSON.parse(readFileSync(new URL("./manifest.json", import.meta.url), "utf8"));

export default manifest;
