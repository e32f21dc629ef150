// llama.cpp's tokenizer speed on a text file, for side-by-side runs with
// build/bench/bench_tokenizer (which writes its text with -o FILE). llama.cpp is
// the prebuilt CPU build inside node-llama-cpp (bench/setup-llamacpp.sh); the
// GGUF is loaded vocabulary-only. Times model.tokenize(text), which includes
// node's UTF-16 -> UTF-8 conversion of the text (a few ms per 10 MB).
//
// usage: node bench/llamacpp_tokenize.mjs VOCAB.gguf TEXT_FILE [RUNS]
// Prints MB/s (best of RUNS, default 3), the token count and an FNV-1a hash of
// the ids, the same hash bench_tokenizer prints.
import {getLlama} from "node-llama-cpp";
import fs from "fs";

const [modelPath, textPath, runsS = "3"] = process.argv.slice(2);
if (!modelPath || !textPath) {
  console.error("usage: node bench/llamacpp_tokenize.mjs VOCAB.gguf TEXT_FILE [RUNS]");
  process.exit(2);
}
const runs = Math.max(1, Number(runsS) | 0);
const bytes = fs.readFileSync(textPath);
const text = bytes.toString("utf8");
const llama = await getLlama({gpu: false, build: "never"});
let t0 = performance.now();
const model = await llama.loadModel({modelPath, vocabOnly: true});
const loadMs = performance.now() - t0;
let best = Infinity, ids = null;
for (let r = 0; r < runs; r++) {
  t0 = performance.now();
  ids = model.tokenize(text, false);
  best = Math.min(best, performance.now() - t0);
}
let h = 2166136261;
for (const id of ids) {
  for (let b = 0; b < 4; b++) {
    h ^= (id >>> (8 * b)) & 0xff;
    h = Math.imul(h, 16777619) >>> 0;
  }
}
console.log(`${modelPath}  load ${loadMs.toFixed(0)} ms  encode ${(bytes.length / 1e6 / (best / 1e3)).toFixed(2)} MB/s ` +
            `(${(best / 1e3).toFixed(3)} s, ${ids.length} tokens)  ids fnv1a ${h.toString(16).padStart(8, "0")}`);
await model.dispose();
