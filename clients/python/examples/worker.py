# Runs the steps of the remote agent `greeter` until SIGTERM or Ctrl-C.
# ROTA_URL and ROTA_TOKEN say where the server is and how to get in.
from rota import Step, Worker

worker = Worker()


@worker.step("greeter")
def greet(step: Step) -> dict[str, str]:
    return {"greeting": "hello, " + step.input["name"]}


worker.run()  # SIGTERM: finishes the steps in hand, then returns
