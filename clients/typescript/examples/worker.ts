// Runs the steps of the remote agent `greeter` until SIGTERM or Ctrl-C.
// ROTA_URL and ROTA_TOKEN say where the server is and how to get in.
import { Worker } from "rota-client";

const worker = new Worker();

worker.step<{ name: string }>("greeter", async (step) => {
  return { greeting: `hello, ${step.input.name}` };
});

await worker.run(); // SIGTERM: finishes the steps in hand, then resolves
