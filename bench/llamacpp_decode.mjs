// llama.cpp's prefill and decode speed on a GGUF file, for side-by-side runs with
// eLLM on exactly the same file. llama.cpp is the prebuilt CPU build inside the npm
// package node-llama-cpp@3.21.1 (bench/setup-llamacpp.sh installs it next to this
// script, so it runs from any working directory).
//
// usage: node bench/llamacpp_decode.mjs MODEL.gguf DEPTH N_TOKENS THREADS FLASH(0|1) [PREFILL] [BATCH]
//   DEPTH     tokens already in the context when decoding starts
//   N_TOKENS  tokens decoded (one at a time, greedy) and timed
//   THREADS   compute threads (exactly this many)
//   FLASH     1: flash attention on, 0: off
//   PREFILL   if > 0, also time a prompt of this many tokens on an empty context
//             (default 0)
//   BATCH     tokens per forward pass in prefill and depth fill (default 512)
// Prints one JSON line; speeds are tokens/s, null where not measured:
//   prefill_tokens_per_s  PREFILL tokens on an empty context
//   fill_tokens_per_s     filling the context to DEPTH (a prefill, at depth 0..DEPTH)
//   decode_tokens_per_s   N_TOKENS single-token steps starting at DEPTH
import {getLlama} from "node-llama-cpp";

const args = process.argv.slice(2);
if (args.length < 5 || args.includes("-h") || args.includes("--help")) {
  console.error("usage: node llamacpp_decode.mjs MODEL.gguf DEPTH N_TOKENS THREADS FLASH(0|1) [PREFILL] [BATCH]");
  process.exit(2);
}
const intArg = (s, name, lo) => {
  const v = Number(s);
  if (!Number.isInteger(v) || v < lo) {
    console.error(`error: ${name} expects an integer >= ${lo}, got '${s}'`);
    process.exit(2);
  }
  return v;
};
const [modelPath, depthS, nS, threadsS, flashS, prefillS = "0", batchS = "512"] = args;
const depth = intArg(depthS, "DEPTH", 0), n = intArg(nS, "N_TOKENS", 1);
const threads = intArg(threadsS, "THREADS", 1), prefill = intArg(prefillS, "PREFILL", 0);
const batchSize = intArg(batchS, "BATCH", 1);
if (flashS !== "0" && flashS !== "1") {
  console.error(`error: FLASH expects 0 or 1, got '${flashS}'`);
  process.exit(2);
}
const flashAttention = flashS === "1";

const llama = await getLlama({gpu: false, build: "never"});
const model = await llama.loadModel({modelPath});
const contextSize = Math.max(depth + n, prefill, 16) + 8;
const ctx = await model.createContext({
  contextSize, batchSize, flashAttention,
  threads: {ideal: threads, min: threads},  // exactly `threads`, never fewer
});
const seq = ctx.getSequence();
// Any valid ids, never BOS/EOS (ids 0..2) and within every tokenizer's range.
const tokens = (len, salt) => Array.from({length: len}, (_, i) => 3 + ((i + salt) * 7919) % 2000);
const now = () => performance.now() / 1000;

// Warm-up: the first evaluation allocates compute buffers.
await seq.evaluateWithoutGeneratingNewTokens(tokens(8, 1));
await seq.clearHistory();

let prefillTps = null;
if (prefill) {
  const t0 = now();
  await seq.evaluateWithoutGeneratingNewTokens(tokens(prefill, 2));
  prefillTps = prefill / (now() - t0);
  await seq.clearHistory();
}

let fillTps = null;
if (depth) {
  const t0 = now();
  await seq.evaluateWithoutGeneratingNewTokens(tokens(depth, 0));
  fillTps = depth / (now() - t0);
}

// Each step feeds the previously sampled token: one forward pass of one token.
const gen = seq.evaluate([5], {temperature: 0});
let k = 0;
const t0 = now();
for await (const _ of gen) { if (++k >= n) break; }
const decodeTps = k / (now() - t0);

console.log(JSON.stringify({
  engine: "llama.cpp", version: "node-llama-cpp@3.21.1", model: modelPath, threads, flashAttention,
  batch: batchSize, prefill, prefill_tokens_per_s: prefillTps, depth, fill_tokens_per_s: fillTps,
  n_decoded: k, decode_tokens_per_s: decodeTps,
}));
await ctx.dispose();
await model.dispose();
