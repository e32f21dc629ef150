// Renders every tests/data/chat/*.jinja template over a fixed set of
// conversations with @huggingface/jinja (the reference Jinja implementation
// used for chat templates) and writes the results next to the templates:
//   conversations.txt   the conversations, for tests/test_chat_template.c
//   NAME.expected       bos/eos given to the template and one record per
//                       (conversation, add_generation_prompt): the rendering,
//                       or the error the template raised
// Run once from a directory where the package is installed:
//   cd /tmp/x && npm i @huggingface/jinja@0.5.13 && node /path/to/eLLM/tools/render_chat_expected.mjs
// Record layout (lengths are UTF-8 bytes; each payload is followed by "\n"):
//   bos LEN\n<bytes>\n   eos LEN\n<bytes>\n
//   case CONV AGP ok|raise|error LEN\n<bytes>\n
// "raise" marks a message that the template passed to raise_exception.
import fs from "node:fs";
import path from "node:path";
import { Template, jinjaVersion, chatDir as dir, TOKENS } from "./chat_jinja.mjs";


const m = (role, content) => ({ role, content });
const CONVERSATIONS = {
	user: [m("user", "Hello")],
	system_user: [m("system", "You are a helpful assistant."), m("user", "What is 2+2?")],
	multi: [
		m("system", "You are a helpful assistant"),
		m("user", "Hello"),
		m("assistant", "Hi there"),
		m("user", "Who are you"),
		m("assistant", "   I am an assistant   "),
		m("user", "Another question"),
	],
	multi_nosys: [m("user", "Hi!"), m("assistant", "Hello! How can I help?"), m("user", "Tell me a joke.")],
	think: [m("user", "What is 1+1?"), m("assistant", "<think>\nSimple sum.\n</think>\n\n2")],
	tricky: [
		m(
			"user",
			"  Line one\nLine two\twith \\ backslash, \"quotes\", 'apostrophes', {{ not_a_tag }} {% if x %} ünïcödé ✓ 日本語 🙂\n",
		),
		m("assistant", "{# still text #} <|im_end|> [/INST]"),
		m("user", "user again"),
	],
};

const record = (head, text) => {
	const bytes = Buffer.from(text, "utf8");
	return Buffer.concat([Buffer.from(`${head} ${bytes.length}\n`), bytes, Buffer.from("\n")]);
};

let convOut = [Buffer.from(`# written by tools/render_chat_expected.mjs; do not edit\n`)];
for (const [name, msgs] of Object.entries(CONVERSATIONS)) {
	convOut.push(Buffer.from(`conversation ${name} ${msgs.length}\n`));
	for (const msg of msgs) convOut.push(record(`message ${msg.role}`, msg.content));
}
fs.writeFileSync(path.join(dir, "conversations.txt"), Buffer.concat(convOut));

const names = fs
	.readdirSync(dir)
	.filter((f) => f.endsWith(".jinja"))
	.map((f) => f.slice(0, -".jinja".length))
	.sort();
for (const name of names) {
	if (!(name in TOKENS)) throw new Error(`no bos/eos for ${name}`);
	const src = fs.readFileSync(path.join(dir, `${name}.jinja`), "utf8");
	const [bos, eos] = TOKENS[name];
	const template = new Template(src);
	const parts = [
		Buffer.from(`# ${name}.jinja rendered by tools/render_chat_expected.mjs with @huggingface/jinja ${jinjaVersion}\n`),
		record("bos", bos),
		record("eos", eos),
	];
	for (const [conv, msgs] of Object.entries(CONVERSATIONS)) {
		for (const agp of [false, true]) {
			let kind = "ok";
			let text;
			try {
				text = template.render({
					messages: structuredClone(msgs),
					add_generation_prompt: agp,
					bos_token: bos,
					eos_token: eos,
					tools: null,
					documents: null,
				});
			} catch (e) {
				text = e.message;
				kind = src.includes("raise_exception") && src.includes(text) ? "raise" : "error";
			}
			parts.push(record(`case ${conv} ${agp ? 1 : 0} ${kind}`, text));
		}
	}
	fs.writeFileSync(path.join(dir, `${name}.expected`), Buffer.concat(parts));
	console.log(name);
}
