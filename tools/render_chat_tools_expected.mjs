// Renders the chat templates of tests/data/chat that handle tool calling
// over conversations with tools (OpenAI's "tools" array, assistant turns
// with "tool_calls", "tool" turns answering them) with @huggingface/jinja,
// and writes tests/data/chat/tools/cases.json: the tools, the conversations
// and, per template, each rendering (or the error it raised), for
// tests/test_chat_template.c. Tool calls reach the templates as eLLM gives
// them (chat.h): an "arguments" string holding a JSON object as that object.
// Run once from a directory where the package is installed:
//   cd /tmp/x && npm i @huggingface/jinja@0.5.13 && node /path/to/eLLM/tools/render_chat_tools_expected.mjs
import fs from "node:fs";
import path from "node:path";
import { Template, jinjaVersion, chatDir as dir, TOKENS } from "./chat_jinja.mjs";

/* the templates of tests/data/chat that handle tools */
const TOOL_TEMPLATES = ["deepseek-r1-distill-qwen", "deepseek-v3", "llama3.2-instruct", "llama3.3-instruct",
	"mistral-nemo-instruct-2407", "qwen2.5-instruct", "qwen3"];

const TOOLS = [
	{
		type: "function",
		function: {
			name: "get_weather",
			description: "The current weather in a city",
			parameters: {
				type: "object",
				properties: {
					city: { type: "string", description: "City name, e.g. Zürich" },
					unit: { type: "string", enum: ["celsius", "fahrenheit"] },
				},
				required: ["city"],
			},
		},
	},
	{
		type: "function",
		function: {
			name: "add",
			description: "Adds two integers",
			parameters: { type: "object", properties: { a: { type: "integer" }, b: { type: "integer" } }, required: ["a", "b"] },
		},
	},
];

/* Messages as a client sends them (arguments as JSON strings; ids of 9
 * letters and digits, as Mistral's template demands; content "" or null
 * beside tool calls, as clients send it). */
const call = (id, name, args) => ({ id, type: "function", function: { name, arguments: JSON.stringify(args) } });
const CONVERSATIONS = {
	ask: [
		{ role: "system", content: "You are a helpful assistant." },
		{ role: "user", content: "What is the weather in Zürich?" },
	],
	answered: [
		{ role: "user", content: "What is the weather in Zürich, and what is 2+3?" },
		{
			role: "assistant",
			content: "",
			tool_calls: [call("call00001", "get_weather", { city: "Zürich", unit: "celsius" }), call("call00002", "add", { a: 2, b: 3 })],
		},
		{ role: "tool", tool_call_id: "call00001", name: "get_weather", content: '{"temperature": 21, "sky": "clear"}' },
		{ role: "tool", tool_call_id: "call00002", name: "add", content: "5" },
	],
	one_call: [
		{ role: "system", content: "Answer briefly." },
		{ role: "user", content: "Add 40 and 2." },
		{ role: "assistant", content: null, tool_calls: [call("call00009", "add", { a: 40, b: 2 })] },
		{ role: "tool", tool_call_id: "call00009", name: "add", content: "42" },
		{ role: "assistant", content: "It is 42." },
		{ role: "user", content: "Thanks!" },
	],
};

/* What a template sees (chat.h): arguments holding a JSON object parsed,
 * or (objects: false) the strings as sent, which eLLM renders with when a
 * template fails on objects with a type error (here: prints them as
 * "[object Map]", as JavaScript does, where Python raises). */
const asTemplateSees = (msgs, objects = true) =>
	msgs.map((m) => {
		const o = { role: m.role, content: m.content ?? null };
		if (m.tool_calls)
			o.tool_calls = m.tool_calls.map((c) => {
				let args = c.function.arguments;
				if (objects) try {
					const v = JSON.parse(args);
					if (v && typeof v === "object" && !Array.isArray(v)) args = v;
				} catch {}
				return { ...c, function: { ...c.function, arguments: args } };
			});
		if (m.tool_call_id) o.tool_call_id = m.tool_call_id;
		if (m.name) o.name = m.name;
		return o;
	});

const out = { generator: `tools/render_chat_tools_expected.mjs with @huggingface/jinja ${jinjaVersion}`, tools: TOOLS,
	conversations: CONVERSATIONS, templates: {} };
for (const name of TOOL_TEMPLATES) {
	const [bos, eos] = TOKENS[name];
	const src = fs.readFileSync(path.join(dir, `${name}.jinja`), "utf8");
	const template = new Template(src);
	const cases = [];
	for (const [conv, msgs] of Object.entries(CONVERSATIONS))
		for (const agp of [false, true]) {
			let kind = "ok", text;
			const render = (objects) => template.render({ messages: asTemplateSees(msgs, objects), add_generation_prompt: agp,
				bos_token: bos, eos_token: eos, tools: structuredClone(TOOLS), documents: null });
			try {
				text = render(true);
				if (text.includes("[object ")) text = render(false);
			} catch (e) {
				text = e.message;
				kind = src.includes("raise_exception") && src.includes(text) ? "raise" : "error";
			}
			cases.push({ conversation: conv, add_generation_prompt: agp, kind, text });
		}
	out.templates[name] = { bos, eos, cases };
}
fs.writeFileSync(path.join(dir, "tools", "cases.json"), JSON.stringify(out, null, 1) + "\n");
console.log(`wrote ${path.join(dir, "tools", "cases.json")}`);
