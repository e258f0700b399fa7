// Submits a task of the workflow `greet` and waits for its result.
// ROTA_URL and ROTA_TOKEN say where the server is and how to get in.
import { Client } from "rota-client";

const client = new Client();
const task = await client.submit("greet", { name: "ada" });
const done = await client.wait(task.id, { timeoutMs: 60_000 });
console.log(done.state, JSON.stringify(done.output));
