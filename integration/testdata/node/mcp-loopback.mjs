// Preloaded (node --import) into @modelcontextprotocol/server-everything for the integration
// tests: its server listens on process.env.PORT on every interface; this binds the first server
// to 127.0.0.1 on a port the system picks, and prints "LISTENING <port>" for the test to read.
import net from "node:net";

const listen = net.Server.prototype.listen;
let done = false;
net.Server.prototype.listen = function (...args) {
  if (done) return listen.apply(this, args);
  done = true;
  const cb = args.find((a) => typeof a === "function");
  this.once("listening", () => console.log(`LISTENING ${this.address().port}`));
  return listen.call(this, 0, "127.0.0.1", cb);
};
