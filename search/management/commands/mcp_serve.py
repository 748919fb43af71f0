"""``manage.py mcp_serve [--transport stdio|http] [--host H] [--port P]``: the MCP server.

stdio: the token comes from ``KB_API_TOKEN``, is checked before serving (a refused token exits
with status 1 and the reason on stderr) and again on every call. http: streamable HTTP at
``http://HOST:PORT/mcp``, each request with ``Authorization: Bearer <token>``.
"""

import os

from django.core.management.base import BaseCommand, CommandError

from projects.selectors import ApiTokenRejected, api_token_authenticate
from search.mcp_server import build_server


class Command(BaseCommand):
    help = "Serve the retrieval tools (search, search_slack, search_code, recent_prs, who_knows) over MCP."

    def add_arguments(self, parser):
        parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
        parser.add_argument("--host", default="127.0.0.1", help="http: interface to listen on (default 127.0.0.1)")
        parser.add_argument("--port", type=int, default=8765, help="http: port (default 8765)")

    def handle(self, *args, transport, host, port, **options):
        if transport == "stdio":
            token = os.environ.get("KB_API_TOKEN", "").strip()
            if not token:
                raise CommandError("set KB_API_TOKEN to an API token (manage.py api_token create ...)")
            try:
                identity = api_token_authenticate(token)
            except ApiTokenRejected as exc:
                raise CommandError(f"KB_API_TOKEN refused: {exc}") from exc
            # stdout carries the protocol: anything for people goes to stderr.
            self.stderr.write(f"kbportal MCP on stdio, token kb_{identity.prefix}_… ({identity.name})")
            build_server(stdio_token=token).run("stdio")
            return
        url = f"http://{host}:{port}"
        self.stderr.write(f"kbportal MCP (streamable HTTP) at {url}/mcp; send Authorization: Bearer <token>")
        build_server(http_url=url).run("streamable-http", host=host, port=port)
