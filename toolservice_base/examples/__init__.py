"""Example tool services: `toolreg serve toolservice_base.examples.joke:JokeService`."""
