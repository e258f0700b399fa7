# Submits a task of the workflow `greet` and waits for its result.
# ROTA_URL and ROTA_TOKEN say where the server is and how to get in.
from rota import Client

client = Client()
task = client.submit("greet", {"name": "ada"})
done = client.wait(task["id"], timeout=60)
print(done["state"], done["output"])
