"""The REST API's routes: Flink's paths and JSON field names (views.py builds the JSON), each a
FlinkHandler (base_handler.py), and ``route_table``, the API's index, which the RestServer serves.

Path parameters and request bodies are checked as Flink's handlers check theirs (a malformed id
or an unknown field is a bad request); what is read runs on the JobManager's loop thread through
``FlinkHandler.view`` / ``on_loop``.
"""
from __future__ import annotations

import asyncio
import json
from http import HTTPStatus
from typing import Any, Optional

from tornado.ioloop import IOLoop

from cluster.checkpoint.inspection import decode_entries, encode_key, json_rows, state_frame
from cluster.state.snapshot_format import UnsupportedKeyError

from cluster.jobmanager.rest.base_handler import HEX_ID, FlinkHandler, RestBackend
from cluster.jobmanager.rest.security import RestError, confined_target
from cluster.jobmanager.rest.diagnosis import bottleneck_json, late_rows_json
from cluster.jobmanager.rest.views import (backpressure_json, checkpoint_config_json, checkpoint_details_json,
                                           checkpoints_json, config_json, exceptions_json, job_json, job_master,
                                           jobs_overview_json, overview_json, plan_json, savepoint_status_json,
                                           taskmanagers_json, vertex_json, vertex_metrics_json, watermarks_json)

STATE_TIMEOUT_S = 120.0  # a fresh checkpoint of a job under load, then the read


# ---------------------------------------------------------------------- request bodies
def _optional(body: dict, name: str, kind: type, route: str) -> Any:
    """A field of a request body, of the JSON type ``kind``; missing or null: None."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        type_name = {str: "a string", bool: "a boolean"}[kind]
        raise RestError(HTTPStatus.BAD_REQUEST,
                        f"Request body of {route}: field {name!r} must be {type_name}, not {json.dumps(value)}")
    return value


def _check_fields(body: dict, known: tuple[str, ...], route: str) -> None:
    # Flink's strict mapper refuses unknown fields; a misspelt target must not silently fall back
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise RestError(HTTPStatus.BAD_REQUEST, f"Request body of {route}: unknown field(s) {', '.join(unknown)}; "
                                                f"expected {', '.join(known)}")


def _savepoint_options(body: dict, route: str, target_field: str, flag_field: str) -> tuple[Optional[str], bool, Optional[str]]:
    """target directory, the flag (cancel-job or drain), and the client's trigger id."""
    _check_fields(body, (target_field, flag_field, "formatType", "triggerId"), route)
    target = _optional(body, target_field, str, route)
    flag = bool(_optional(body, flag_field, bool, route))
    format_type = _optional(body, "formatType", str, route)
    if format_type is not None and format_type != "CANONICAL":
        raise RestError(HTTPStatus.BAD_REQUEST, f"Request body of {route}: formatType {format_type!r} is not "
                                                "supported; streamlab writes CANONICAL savepoints")
    trigger_id = _optional(body, "triggerId", str, route)
    if trigger_id is not None and not HEX_ID.fullmatch(trigger_id):
        raise RestError(HTTPStatus.BAD_REQUEST,
                        f"Request body of {route}: triggerId must be 32 hexadecimal characters, not {trigger_id!r}")
    return target, flag, trigger_id



class NotFoundHandler(FlinkHandler):
    """Every path the route table does not name, for every method (after the guard)."""

    def _not_found(self, *args) -> None:
        raise RestError(HTTPStatus.NOT_FOUND, f"Not found: {self.request.path}")

    get = post = patch = put = delete = head = options = _not_found


# -- the cluster
class OverviewHandler(FlinkHandler):
    async def get(self) -> None:
        await self.view(overview_json)


class ConfigHandler(FlinkHandler):
    async def get(self) -> None:
        await self.view(lambda d: config_json())


class TaskManagersHandler(FlinkHandler):
    async def get(self) -> None:
        await self.view(taskmanagers_json)


# -- jobs
class JobsHandler(FlinkHandler):
    async def get(self) -> None:
        await self.view(lambda d: {"jobs": [{"id": j.job_id, "status": j.state} for j in d.jobs.values()]})


class JobsOverviewHandler(FlinkHandler):
    async def get(self) -> None:
        await self.view(jobs_overview_json)


class JobHandler(FlinkHandler):
    async def get(self, job_id: str) -> None:
        await self.view(job_json, self.hex_id(job_id, "job id"))

    async def patch(self, job_id: str) -> None:
        job_id = self.hex_id(job_id, "job id")
        mode = self.get_query_argument("mode", "cancel")
        if mode.lower() == "stop":
            raise RestError(HTTPStatus.BAD_REQUEST, 'The termination mode "stop" has been removed. Use "cancel", '
                                                    f"or POST /jobs/{job_id}/stop for a stop with a savepoint")
        if mode.lower() != "cancel":
            raise RestError(HTTPStatus.BAD_REQUEST, f"Unsupported termination mode {mode!r}; use mode=cancel")
        await self.on_loop(lambda: job_master(self.dispatcher, job_id).cancel())
        self.answer(HTTPStatus.ACCEPTED, {})


class JobStatusHandler(FlinkHandler):
    async def get(self, job_id: str) -> None:
        await self.view(lambda d, jid: {"status": job_master(d, jid).state}, self.hex_id(job_id, "job id"))


class JobPlanHandler(FlinkHandler):
    async def get(self, job_id: str) -> None:
        await self.view(lambda d, jid: {"plan": plan_json(job_master(d, jid))}, self.hex_id(job_id, "job id"))


class JobExceptionsHandler(FlinkHandler):
    async def get(self, job_id: str) -> None:
        job_id = self.hex_id(job_id, "job id")
        given = self.get_query_argument("maxExceptions", None)
        limit = None if given is None else self.int_id(given, "maxExceptions", bits=32)

        def exceptions(d, jid):
            body = exceptions_json(job_master(d, jid), d)
            history = body["exceptionHistory"]
            if limit is not None and len(history["entries"]) > max(limit, 0):
                history["entries"], history["truncated"] = history["entries"][:max(limit, 0)], True
            return body
        await self.view(exceptions, job_id)


# -- checkpoints and savepoints
class CheckpointsHandler(FlinkHandler):
    async def get(self, job_id: str) -> None:
        await self.view(checkpoints_json, self.hex_id(job_id, "job id"))


class CheckpointConfigHandler(FlinkHandler):
    async def get(self, job_id: str) -> None:
        await self.view(checkpoint_config_json, self.hex_id(job_id, "job id"))


class CheckpointDetailsHandler(FlinkHandler):
    async def get(self, job_id: str, checkpoint_id: str) -> None:
        await self.view(checkpoint_details_json, self.hex_id(job_id, "job id"),
                        self.int_id(checkpoint_id, "checkpoint id"))


class SavepointHandler(FlinkHandler):
    """POST /jobs/<id>/savepoints (``target-directory``, ``cancel-job``), Flink's asynchronous
    operation: 202 with a trigger id, then GET .../savepoints/<trigger id>."""

    stop, target_field, flag_field = False, "target-directory", "cancel-job"

    async def post(self, job_id: str) -> None:
        job_id = self.hex_id(job_id, "job id")
        route = f"POST /jobs/<id>/{'stop' if self.stop else 'savepoints'}"
        target, flag, client_trigger = _savepoint_options(self.json_body(), route, self.target_field, self.flag_field)
        if self.stop and flag:
            raise RestError(HTTPStatus.BAD_REQUEST, f"{route}: drain is not supported (no MAX_WATERMARK to emit); "
                                                    "stop without it")
        if target is not None:
            savepoints_dir, allowed = await self.on_loop(self.server.savepoint_folders, job_id)
            target = confined_target(target, savepoints_dir, allowed)
        trigger = await self.on_loop(self.server.trigger_savepoint, job_id, target, self.stop or flag, client_trigger)
        self.answer(HTTPStatus.ACCEPTED, {"request-id": trigger})


class StopWithSavepointHandler(SavepointHandler):
    """POST /jobs/<id>/stop (``targetDirectory``, ``drain``): a savepoint, then the job ends FINISHED."""

    stop, target_field, flag_field = True, "targetDirectory", "drain"


class SavepointStatusHandler(FlinkHandler):
    async def get(self, job_id: str, trigger_id: str) -> None:
        job_id, trigger_id = self.hex_id(job_id, "job id"), self.hex_id(trigger_id, "trigger id")
        await self.view(lambda d: savepoint_status_json(d, job_id, self.server.savepoint_trigger(job_id, trigger_id)))


class BottleneckHandler(FlinkHandler):
    async def get(self, job_id: str) -> None:
        await self.view(lambda d, jid: bottleneck_json(job_master(d, jid)), self.hex_id(job_id, "job id"))


class LateRowsHandler(FlinkHandler):
    async def get(self, job_id: str) -> None:
        await self.view(lambda d, jid: late_rows_json(job_master(d, jid)), self.hex_id(job_id, "job id"))


# -- keyed state
class JobStateHandler(FlinkHandler):
    """GET /jobs/<id>/state?operator=NAME[&key=K][&fresh=true]: an operator's keyed state at the
    newest completed checkpoint (or one taken now), one row per key (cluster.checkpoint.inspection).
    ``key`` is JSON (``3``, ``"a"``, ``[1, "a"]`` for several key columns) or else a plain string."""

    async def get(self, job_id: str) -> None:
        job_id = self.hex_id(job_id, "job id")
        operator = self.get_query_argument("operator", "")
        if not operator:
            raise RestError(HTTPStatus.BAD_REQUEST, "GET /jobs/<id>/state: give the operator, "
                                                    "?operator=<its name or uid>")
        fresh = self.get_query_argument("fresh", "false").lower()
        if fresh not in ("true", "false"):
            raise RestError(HTTPStatus.BAD_REQUEST, f"GET /jobs/<id>/state: fresh must be true or false, not {fresh!r}")
        key = self.get_query_argument("key", None)
        try:
            encoded = None if key is None else encode_key(_key_argument(key))
        except UnsupportedKeyError as exc:
            raise RestError(HTTPStatus.BAD_REQUEST, f"GET /jobs/<id>/state: key {key!r}: {exc}") from None
        io_loop = IOLoop.current()
        answered: asyncio.Future = asyncio.get_running_loop().create_future()

        def settle(answer, error) -> None:  # IOLoop thread
            if not answered.done():
                answered.set_exception(error) if error is not None else answered.set_result(answer)

        def start() -> None:  # JobManager loop thread
            try:
                job_master(self.dispatcher, job_id).request_keyed_state(
                    operator, encoded, fresh == "true", lambda a, e: io_loop.add_callback(settle, a, e))
            except Exception as exc:  # NotFound, RpcError: answers
                io_loop.add_callback(settle, None, exc)

        self.dispatcher.endpoint.call_soon(start)
        try:
            answer = await asyncio.wait_for(answered, STATE_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise RestError(HTTPStatus.SERVICE_UNAVAILABLE,
                            f"The state of {operator!r} was not read within {STATE_TIMEOUT_S:g} s") from None
        # unpickling and encoding may take a while: not on this IOLoop, which serves every route
        self.write(await io_loop.run_in_executor(None, _state_json, answer))


def _key_argument(text: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return tuple(value) if isinstance(value, list) else value


def _state_json(answer) -> bytes:
    frame = state_frame(decode_entries(answer.entries, lenient=True), answer.operator)
    columns, rows = json_rows(frame)
    return json.dumps({"checkpoint_id": answer.checkpoint_id, "operator": answer.operator["name"],
                       "uid": answer.operator["uid"], "key_columns": answer.operator["key"],
                       "sources": answer.sources, "columns": columns, "rows": rows}).encode()


# -- vertices
class VertexHandler(FlinkHandler):
    async def get(self, job_id: str, vertex_id: str) -> None:
        await self.view(vertex_json, self.hex_id(job_id, "job id"), self.hex_id(vertex_id, "vertex id"))


class BackpressureHandler(FlinkHandler):
    async def get(self, job_id: str, vertex_id: str) -> None:
        await self.view(backpressure_json, self.hex_id(job_id, "job id"), self.hex_id(vertex_id, "vertex id"))


class WatermarksHandler(FlinkHandler):
    async def get(self, job_id: str, vertex_id: str) -> None:
        await self.view(watermarks_json, self.hex_id(job_id, "job id"), self.hex_id(vertex_id, "vertex id"))


class VertexMetricsHandler(FlinkHandler):
    async def get(self, job_id: str, vertex_id: str) -> None:
        given = self.get_query_argument("get", None)
        names = None if given is None else [n.strip() for n in given.split(",") if n.strip()]
        await self.view(vertex_metrics_json, self.hex_id(job_id, "job id"), self.hex_id(vertex_id, "vertex id"),
                        names or None)



# ---------------------------------------------------------------------- the route table
_JOB = r"/jobs/(?P<job_id>[^/]+)"


def route_table(server: RestBackend) -> list:
    """The API's index: Flink's paths (also under /v1, with or without a trailing slash)."""
    routes = [
        (r"/overview", OverviewHandler),
        (r"/config", ConfigHandler),
        (r"/taskmanagers", TaskManagersHandler),
        (r"/jobs", JobsHandler),
        (r"/jobs/overview", JobsOverviewHandler),
        (_JOB, JobHandler),                                              # GET details, PATCH ?mode=cancel
        (_JOB + r"/status", JobStatusHandler),
        (_JOB + r"/plan", JobPlanHandler),
        (_JOB + r"/exceptions", JobExceptionsHandler),
        (_JOB + r"/checkpoints", CheckpointsHandler),
        (_JOB + r"/checkpoints/config", CheckpointConfigHandler),
        (_JOB + r"/checkpoints/details/(?P<checkpoint_id>[^/]+)", CheckpointDetailsHandler),
        (_JOB + r"/savepoints", SavepointHandler),
        (_JOB + r"/savepoints/(?P<trigger_id>[^/]+)", SavepointStatusHandler),
        (_JOB + r"/stop", StopWithSavepointHandler),
        (_JOB + r"/state", JobStateHandler),                              # keyed state, ?operator=
        (_JOB + r"/late-rows", LateRowsHandler),                          # what windows and joins found late
        (_JOB + r"/bottleneck", BottleneckHandler),                        # the vertex that limits the job
        (_JOB + r"/vertices/(?P<vertex_id>[^/]+)", VertexHandler),
        (_JOB + r"/vertices/(?P<vertex_id>[^/]+)/backpressure", BackpressureHandler),
        (_JOB + r"/vertices/(?P<vertex_id>[^/]+)/watermarks", WatermarksHandler),
        (_JOB + r"/vertices/(?P<vertex_id>[^/]+)/metrics", VertexMetricsHandler),
    ]
    return [(rf"(?:/v1)?{path}/?", handler, {"server": server}) for path, handler in routes]

