"""OpenAPI description of the API key authentication, for drf-spectacular."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "anex.api.authentication.ApiKeyAuthentication"
    name = ["bearerAuth", "apiKeyHeader"]

    def get_security_requirement(self, auto_schema: Any) -> list[dict[str, list[Any]]]:
        # Either header carries the key: two alternatives (OR), never both at once (AND).
        return [{"bearerAuth": []}, {"apiKeyHeader": []}]

    def get_security_definition(self, auto_schema: Any) -> list[dict[str, Any]]:
        return [
            {
                "type": "http",
                "scheme": "bearer",
                "description": "An API key from the console's Keys page: sk-…",
            },
            {
                "type": "apiKey",
                "in": "header",
                "name": "x-api-key",
                "description": "The same API key, for clients that send x-api-key.",
            },
        ]
