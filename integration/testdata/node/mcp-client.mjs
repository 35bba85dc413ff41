// The agent of integration/mcp_test.go: the MCP TypeScript SDK's client over streamable HTTP,
// through the broker (HTTPS_PROXY, via undici's EnvHttpProxyAgent). It prints one line per
// step, "<step> <JSON>", and "error <message>" for what the SDK reports as failed.
import { EnvHttpProxyAgent, setGlobalDispatcher } from "undici";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

setGlobalDispatcher(new EnvHttpProxyAgent());
const out = (step, v) => console.log(`${step} ${JSON.stringify(v)}`);
const attempt = async (step, f) => {
  try {
    out(step, await f());
  } catch (e) {
    out(`${step}-error`, `${e && e.code} ${e && e.message}`);
  }
};

const client = new Client({ name: "capbroker-test", version: "1.0.0" });
await client.connect(new StreamableHTTPClientTransport(new URL(process.argv[2])));
await attempt("tools", async () => (await client.listTools()).tools.map((t) => t.name).sort());
await attempt("echo", async () => (await client.callTool({ name: "echo", arguments: { message: "hello" } })).content);
await attempt("echo-secret", async () => (await client.callTool({ name: "echo", arguments: { message: "secret-plan" } })).content);
await attempt("sum", async () => (await client.callTool({ name: "get-sum", arguments: { a: 1, b: 2 } })).content);
const progress = [];
await attempt("long", async () =>
  (await client.callTool({ name: "trigger-long-running-operation", arguments: { duration: 0.3, steps: 3 } }, undefined, {
    onprogress: (p) => progress.push(p.progress),
  })).content);
out("progress", progress);
await client.close();
