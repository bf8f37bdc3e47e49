"""The OpenAPI schema of the rollout API and the proxy (served at `/openapi.json`)."""

from __future__ import annotations

from typing import Any

_ERROR = {"$ref": "#/components/responses/Error"}
_JSON_OBJECT = {"type": "object", "additionalProperties": True}


def _body(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _ok(description: str, properties: dict[str, Any] | None = None) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties} if properties else _JSON_OBJECT
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*statuses: int) -> dict[str, Any]:
    return {str(status): _ERROR for status in statuses}


_ROLLOUT_ID = {"name": "rollout_id", "in": "path", "required": True, "schema": {"type": "string"}}
_STRINGS = {"type": "array", "items": {"type": "string"}}


def _paths() -> dict[str, Any]:
    started = {
        "rollout_id": {"type": "string"},
        "run": {"type": "string"},
        "group_id": {"type": "string"},
        "token": {"type": "string", "description": "shown once; dies when the rollout ends"},
        "base_url": {"type": "string", "description": "the agent's OpenAI base URL"},
    }
    start_body = {
        "model": {"type": "string", "description": "the model's name"},
        "scenario": {"description": "any JSON"},
        "scenario_index": {"type": "integer"},
        "group_id": {"type": "string", "description": "the group (a new one if not given)"},
        "role": {"type": "string", "enum": ["policy", "validation"]},
        "inference_model_name": {"type": "string"},
        "resumes": {
            "type": "string",
            "description": "a rollout of the run that did not finish (its agent started "
            "again): the answers it recorded are served back while the requests match",
        },
    }
    finish_body = {
        "result": {"description": "any JSON"},
        "rewards": {"type": "object", "additionalProperties": {"type": "number"}},
        "metrics": {"type": "object", "additionalProperties": {"type": "number"}},
        "metadata": _JSON_OBJECT,
        "logs": _STRINGS,
    }
    return {
        "/api/runs/{run}/rollouts": {
            "post": {
                "summary": "Start a rollout in a run",
                "parameters": [_RUN],
                "requestBody": _body(start_body, ["model"]),
                "responses": {
                    "201": _ok("started", started),
                    **_errors(400, 401, 403, 404, 409, 413),
                },
            }
        },
        **_rollout_paths(finish_body),
        **_claims_paths(),
        **_proxy_paths(),
    }


# A run's name may hold `/` (`project/model`, as TrainingFramework names runs): the route
# takes the rest of the path up to the last segment, and `%2F` works too.
_RUN = {
    "name": "run",
    "in": "path",
    "required": True,
    "description": "the run's name; it may contain '/' (e.g. project/model), as is or as %2F",
    "schema": {"type": "string"},
}
_CLAIMS = {"type": "array", "items": _JSON_OBJECT}


def _claims_path(summary: str, body: dict[str, Any], answer: str) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "parameters": [_RUN],
            "requestBody": _body(body),
            "responses": {"200": _ok(answer), **_errors(400, 401, 403, 404, 409, 413)},
        }
    }


def _claims_paths() -> dict[str, Any]:
    """Rollout workers through the server (`artstore worker --server`), PostgreSQL only."""
    lease = {"type": "number", "description": "seconds a claim lasts without a renewal"}
    return {
        "/api/runs/{run}/claims": _claims_path(
            "Claim seals and rollout slots of a run for a worker",
            {"worker": {"type": "string"}, "limit": {"type": "integer"}, "lease_s": lease},
            "the run's status; claimed rollouts (started here, with token and base_url) "
            "and seals (with the group's results and trajectories)",
        ),
        "/api/runs/{run}/claims/renew": _claims_path(
            "Renew a worker's leases (its heartbeat)",
            {"rollouts": _CLAIMS, "seals": _CLAIMS, "lease_s": lease},
            "lost_rollouts, lost_seals: the claims the worker no longer holds",
        ),
        "/api/runs/{run}/claims/release": _claims_path(
            "Give a claim back",
            {"rollout": _JSON_OBJECT, "seal": _JSON_OBJECT},
            "outcome: released, ended or lost",
        ),
        "/api/runs/{run}/claims/seal": _claims_path(
            "Seal a claimed group with its worker's rewards, or fail it",
            {
                "seal": _JSON_OBJECT,
                "rollout_ids": _STRINGS,
                "rewards": {"type": "array", "items": {"type": "number"}},
                "error": {"type": "string"},
            },
            "the group's status: sealed or failed",
        ),
    }


def _rollout_paths(finish_body: dict[str, Any]) -> dict[str, Any]:
    error = {"oneOf": [{"type": "string"}, {"type": "object"}]}
    rollout = {"parameters": [_ROLLOUT_ID]}
    return {
        "/api/rollouts/{rollout_id}": {
            **rollout,
            "get": {
                "summary": "A rollout's status",
                "responses": {"200": _ok("the rollout"), **_errors(401, 403, 404)},
            },
        },
        "/api/rollouts/{rollout_id}/log": {
            **rollout,
            "post": {
                "summary": "Log lines (kept in the trajectory's logs)",
                "requestBody": _body({"lines": _STRINGS, "message": {"type": "string"}}),
                "responses": {"200": _ok("logged"), **_errors(400, 401, 403, 404, 409, 413)},
            },
        },
        "/api/rollouts/{rollout_id}/finish": {
            **rollout,
            "post": {
                "summary": "Finish with a result, rewards per scorer and metrics",
                "requestBody": _body(finish_body),
                "responses": {"200": _ok("finished"), **_errors(400, 401, 403, 404, 409, 413)},
            },
        },
        "/api/rollouts/{rollout_id}/fail": {
            **rollout,
            "post": {
                "summary": "Fail with an error",
                "requestBody": _body({"error": error, "logs": _STRINGS}, ["error"]),
                "responses": {"200": _ok("failed"), **_errors(400, 401, 403, 404, 409, 413)},
            },
        },
        "/api/rollouts/{rollout_id}/trajectory": {
            **rollout,
            "get": {
                "summary": "The rollout's art.Trajectory, as JSON",
                "parameters": [{"name": "scorer", "in": "query", "schema": {"type": "string"}}],
                "responses": {"200": _ok("the trajectory"), **_errors(401, 403, 404)},
            },
        },
    }


def _proxy_paths() -> dict[str, Any]:
    return {
        "/r/{token}/v1/{path}": {
            "post": {
                "summary": "OpenAI-compatible API, recorded in the token's rollout",
                "description": "chat/completions, completions, responses (streamed or not) "
                "are relayed to the upstream and recorded; GET models is relayed.",
                "parameters": [
                    {"name": "token", "in": "path", "required": True, "schema": {"type": "string"}},
                    {"name": "path", "in": "path", "required": True, "schema": {"type": "string"}},
                ],
                "responses": {"200": _ok("the upstream's answer"), **_errors(401, 409, 413, 502)},
            }
        },
    }


def openapi_schema() -> dict[str, Any]:
    error = {
        "type": "object",
        "properties": {
            "error": {
                "type": "object",
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
            }
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "artstore serve", "version": "1"},
        "components": {
            "securitySchemes": {"token": {"type": "http", "scheme": "bearer"}},
            "responses": {
                "Error": {
                    "description": "refused; nothing was written",
                    "content": {"application/json": {"schema": error}},
                }
            },
        },
        "security": [{"token": []}, {}],
        "paths": _paths(),
    }
