// The agent of integration/fleet_test.go: the MCP TypeScript SDK's client over streamable
// HTTP through a fleet of brokers behind one address (HTTPS_PROXY). Each request opens a
// connection of its own, so that the Service spreads one MCP session over the replicas. It
// prints one line per step, "<step> <text>".
import { EnvHttpProxyAgent } from "undici";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const fresh = (url, init) => {
  const dispatcher = new EnvHttpProxyAgent();
  return fetch(url, { ...init, dispatcher });
};
const client = new Client({ name: "capbroker-fleet-test", version: "1.0.0" });
await client.connect(new StreamableHTTPClientTransport(new URL(process.argv[2]), { fetch: fresh }));
for (let i = 0; i < 4; i++) {
  const tools = (await client.listTools()).tools.map((t) => t.name);
  console.log(`tools ${tools.includes("echo")}`);
}
const r = await client.callTool({ name: "echo", arguments: { message: "hello" } });
console.log(`echo ${r.content[0].text}`);
await client.close();
process.exit(0);
