// What the chat-template fixture scripts share (render_chat_expected.mjs,
// render_chat_tools_expected.mjs): @huggingface/jinja from the directory the
// script runs in, a fixed clock for strftime_now (2024-07-26 12:00:00 UTC,
// unix 1721995200, as tests/test_chat_template.c passes), the fixtures'
// folder, and each template's bos/eos texts.
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

// Special-token texts each family's tokenizer gives bos_token / eos_token.
export const TOKENS = {
	"chatml": ["<s>", "</s>"],
	"command-r": ["<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"],
	"deepseek-coder-instruct": ["<｜begin▁of▁sentence｜>", "<|EOT|>"],
	"deepseek-llm-chat": ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"],
	"deepseek-r1-distill-qwen": ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"],
	"deepseek-v3": ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"],
	"gemma-7b-it": ["<bos>", "<eos>"],
	"llama2-chat": ["<s>", "</s>"],
	"llama3-instruct": ["<|begin_of_text|>", "<|eot_id|>"],
	"llama3.2-instruct": ["<|begin_of_text|>", "<|eot_id|>"],
	"llama3.3-instruct": ["<|begin_of_text|>", "<|eot_id|>"],
	"mistral-7b-instruct-v0.1": ["<s>", "</s>"],
	"mistral-nemo-instruct-2407": ["<s>", "</s>"],
	"mistral-v1-system": ["<s>", "</s>"],
	"mixtral-8x7b-instruct-v0.1": ["<s>", "</s>"],
	"phi-3-mini": ["<s>", "<|endoftext|>"],
	"phi-3-small": ["<|endoftext|>", "<|endoftext|>"],
	"phi-3.5-mini-instruct": ["<s>", "<|endoftext|>"],
	"qwen2": ["<|endoftext|>", "<|endoftext|>"],
	"qwen2.5-instruct": ["<|endoftext|>", "<|im_end|>"],
	"qwen3": ["", "<|im_end|>"],
	"zephyr-7b-beta": ["<s>", "</s>"],
	"gemma-2-it": ["<bos>", "<eos>"],
	"openchat-3.5": ["<s>", "<|end_of_turn|>"],
	"qwen1.5-chat": ["<|endoftext|>", "<|im_end|>"],
	"deci-7b-instruct": ["<s>", "</s>"],
	"falcon-rw-1b-chat": ["<|endoftext|>", "<|endoftext|>"],
	"smaug-34b": ["<s>", "</s>"],
	"synatra-mixtral": ["<s>", "</s>"],
	"pivot-moe": ["<s>", "</s>"],
};
