"""The live page: server-rendered HTML, a little JavaScript, no build step."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter(include_in_schema=False)


@router.get("/", response_class=HTMLResponse)
async def index() -> str:
    return "<!doctype html><title>sessionflow</title>"
