// Golden token ids for a tokenizer.json, from transformers.js (@lenml/tokenizers,
// a port of the Hugging Face tokenizers), for tests/test_tokenizer_bpe.c.
//
// usage: node tools/hf_vectors.mjs DIR INPUT [bos]
//   DIR    a folder with tokenizer.json and tokenizer_config.json
//   INPUT  strings separated by "\n__ggml_vocab_test__\n" (llama.cpp's .inp format)
//   bos    add the tokenizer's special tokens (BOS) too; otherwise none are added
// Prints one line of space-separated ids per string (llama.cpp's .out format).
// Needs @lenml/tokenizers: npm i --no-save @lenml/tokenizers@3.7.2 (in any folder
// that node resolves from, e.g. with NODE_PATH).
import {TokenizerLoader} from "@lenml/tokenizers";
import fs from "fs";

const [dir, input, bos] = process.argv.slice(2);
if (!dir || !input) {
  console.error("usage: node tools/hf_vectors.mjs DIR INPUT [bos]");
  process.exit(2);
}
const read = (f) => JSON.parse(fs.readFileSync(`${dir}/${f}`, "utf8"));
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: read("tokenizer.json"),
  tokenizerConfig: fs.existsSync(`${dir}/tokenizer_config.json`) ? read("tokenizer_config.json") : {},
});
const parts = fs.readFileSync(input, "utf8").split("\n__ggml_vocab_test__\n");
parts.pop(); // the text after the last separator is not a test string
for (const p of parts) console.log(tok.encode(p, {add_special_tokens: bos === "bos"}).join(" "));
