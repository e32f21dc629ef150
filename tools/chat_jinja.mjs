// What the chat-template fixture scripts share (render_chat_expected.mjs,
// render_chat_tools_expected.mjs): @huggingface/jinja from the directory the
// script runs in, a fixed clock for strftime_now (2024-07-26 12:00:00 UTC,
// unix 1721995200, as tests/test_chat_template.c passes), and the fixtures'
// folder.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

process.env.TZ = "UTC";
const FIXED_NOW = 1721995200 * 1000;
const RealDate = Date;
globalThis.Date = class extends RealDate {
	constructor(...args) {
		super(...(args.length ? args : [FIXED_NOW]));
	}
	static now() {
		return FIXED_NOW;
	}
};

const require = createRequire(path.join(process.cwd(), "noop.js"));
export const { Template } = require("@huggingface/jinja");
const jinjaDir = path.dirname(require.resolve("@huggingface/jinja"));
export const jinjaVersion = JSON.parse(fs.readFileSync(path.join(jinjaDir, "..", "package.json"), "utf8")).version;
export const chatDir = path.join(path.dirname(fileURLToPath(import.meta.url)), "..", "tests", "data", "chat");
