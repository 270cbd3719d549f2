// Reference token counts for paywire's estimator tests (test-time only, never at run time).
// Reads a JSON array of strings on stdin; prints a JSON array of {cl100k_base, o200k_base}
// counts, one per input, computed with gpt-tokenizer's real BPE encoders.
// Special-token strings in the input are encoded as plain text, matching tiktoken's
// encode_ordinary, so both references count the same thing.
import { countTokens as countCl100k } from "gpt-tokenizer/encoding/cl100k_base";
import { countTokens as countO200k } from "gpt-tokenizer/encoding/o200k_base";

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const texts = JSON.parse(Buffer.concat(chunks).toString("utf8"));
if (!Array.isArray(texts)) {
  process.stderr.write("expected a JSON array of strings on stdin\n");
  process.exit(2);
}
const opts = { disallowedSpecial: new Set() };
const out = texts.map((t) => ({
  cl100k_base: countCl100k(String(t), opts),
  o200k_base: countO200k(String(t), opts),
}));
process.stdout.write(JSON.stringify(out) + "\n");
