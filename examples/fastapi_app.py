"""A FastAPI app with the gateway mounted and an engine of its own.

Run it: ``uvicorn examples.fastapi_app:app`` (from the repository root),
then speak the gateway protocol at ``ws://127.0.0.1:8000/gateway/v1?user=ada``.

The engine spells each input back, one letter per event; ``start`` greets
the session's user. ``authenticate`` takes the user from the query string:
a demo of identities (a resume must come from the same user), not security.
"""

from __future__ import annotations

from fastapi import FastAPI

from supervisor.gateway import EngineSession, GatewayApp, GatewayConfig, Handshake


class SpellingEngine:
    """An Engine: greets each session, answers an input letter by letter."""

    def __init__(self) -> None:
        self.sessions_stopped: list[str] = []

    async def start(self, session: EngineSession) -> None:
        await session.send({"type": "hello", "user": str(session.identity)})

    async def answer(self, session: EngineSession, client_event_id: str, text: str) -> None:
        for letter in text:
            await session.send({"type": "letter", "letter": letter})
        await session.send({"type": "response.done", "client_event_id": client_event_id})

    def stop(self, session_id: str) -> None:
        self.sessions_stopped.append(session_id)


def authenticate(handshake: Handshake) -> str | None:
    users = handshake.query_params().get("user")
    return users[0] if users else None


engine = SpellingEngine()
gateway = GatewayApp(GatewayConfig(), engine=engine, authenticate=authenticate)
app = FastAPI(lifespan=gateway.lifespan)
app.mount("/gateway", gateway)


@app.get("/")
async def index() -> dict[str, str]:
    return {"websocket": "/gateway/v1?user=NAME"}
