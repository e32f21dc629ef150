// llama.cpp's next-token distribution after every token of an id file, from the
// prebuilt CPU build inside node-llama-cpp (pinned in package-lock.json; `make
// test` installs it with npm ci). tests/test_convert_llamacpp.c compares it with
// eLLM on GGUF files written by `ellm convert`.
//
// usage: node logprobs.mjs MODEL.gguf IDS_FILE [THREADS]
// IDS_FILE holds whitespace-separated token ids (n of them). The ids are fed as
// one sequence with no BOS added; after each of the first n-1 ids the
// temperature-1 distribution over the whole vocabulary is read. Prints one line
// Exit status 2 on bad arguments, 1 if llama.cpp refuses the file.
import {getLlama} from "node-llama-cpp";
import fs from "fs";

const [modelPath, idsPath, threadsS = "1"] = process.argv.slice(2);
if (!modelPath || !idsPath) {
  console.error("usage: node logprobs.mjs MODEL.gguf IDS_FILE [THREADS]");
  process.exit(2);
}
const ids = fs.readFileSync(idsPath, "utf8").trim().split(/\s+/).map(Number);
try {
  const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
  const model = await llama.loadModel({modelPath});
  const ctx = await model.createContext({contextSize: Math.max(32, ids.length + 8), threads: +threadsS,
    batchSize: Math.max(32, ids.length), flashAttention: false});
  const seq = ctx.getSequence();
  // temperature 1, no top-k/top-p/min-p cut: the plain softmax of the logits.
  const opt = {temperature: 1, topK: 0, topP: 1, minP: 0, seed: 1};
  const input = ids.map((id, i) => i < ids.length - 1 ?
    [id, {generateNext: {probabilities: true, options: opt}}] : id);
  const out = await seq.controlledEvaluate(input);
  const lines = [];
  for (let i = 0; i < ids.length - 1; i++) {
    const p = out[i]?.next?.probabilities;
    if (!p) throw new Error(`no probabilities at position ${i}`);
    const [top, ptop] = p.entries().next().value;
    const pn = p.get(ids[i + 1]) ?? 0;
    lines.push(`${top} ${Math.log(pn)} ${Math.log(ptop)}`);
  }
  console.log(lines.join("\n"));
  await ctx.dispose();
  await model.dispose();
} catch (e) {
  console.error(`llama.cpp: ${e?.message ?? e}`);
  process.exit(1);
}
