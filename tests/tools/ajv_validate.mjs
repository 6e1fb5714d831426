// Validate documents against JSON Schemas with Ajv (draft 2020-12, strict mode: unknown keywords are errors;
// patterns are compiled as ECMAScript regular expressions with the "u" flag, as editors run them):
//   node tests/tools/ajv_validate.mjs <ajv package dir> <schema.json>... < {"schema": "<file name>", "documents": {...}}
// Each schema is registered under its file name, so relative "$ref"s between them resolve. Prints one JSON object:
// {"<document name>": ["<instance path>: <message>", ...], ...}; exits 1 when a schema does not compile.
import { readFileSync } from "node:fs";
import { basename, join } from "node:path";
import { pathToFileURL } from "node:url";

const [packageDir, ...schemaFiles] = process.argv.slice(2);
const { default: Ajv2020 } = await import(pathToFileURL(join(packageDir, "dist", "2020.js")).href);
const ajv = new Ajv2020({ strict: true, allErrors: true });
for (const file of schemaFiles) {
  ajv.addSchema(JSON.parse(readFileSync(file, "utf8")), basename(file));
}
const request = JSON.parse(readFileSync(0, "utf8"));
let validate;
try {
  validate = ajv.getSchema(request.schema);
} catch (error) {
  console.error(`schema does not compile: ${error.message}`);
  process.exit(1);
}
if (!validate) {
  console.error(`no schema named ${request.schema}`);
  process.exit(1);
}
const results = {};
for (const [name, document] of Object.entries(request.documents)) {
  results[name] = validate(document) ? [] : validate.errors.map((e) => `${e.instancePath}: ${e.message}`);
}
console.log(JSON.stringify(results));
