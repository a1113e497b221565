"""The runtime: controller, host agent, template (fork server) and proc processes, plus the client."""
