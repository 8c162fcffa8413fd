"""The one normalization of tool output shown to the model, and the one place it is capped.

Every text a built-in tool returns goes through ``normalize`` (``clip`` and ``text_output`` call
it). The rule, applied in this order:

1. Bytes are decoded as UTF-8; each invalid sequence becomes U+FFFD. In a ``str``, lone
   surrogates (U+D800..U+DFFF, e.g. from ``surrogateescape`` file names) become U+FFFD.
2. Terminal escape sequences are removed: ESC-introduced CSI (colors, cursor moves), OSC
   (titles, hyperlinks; BEL- or ST-terminated, or unterminated to the end), DCS/SOS/PM/APC
   strings, two-character escapes, and the 8-bit CSI U+009B.
3. ``\\r\\n`` becomes ``\\n`` and a lone ``\\r`` (progress bars) becomes ``\\n``.
4. Every other control character is removed: C0 except tab and newline (so NUL goes), DEL, and
   C1 (U+0080..U+009F).

Everything else is kept as is, including bidi overrides, zero-width characters, emoji and
combining marks: they are text, and the store keeps any string losslessly (``store/codec.py``).
The rule is idempotent, so a piece normalized early (a line of a file) is unchanged when the
whole output passes through it again.

The cap counts UTF-8 bytes of the normalized text. Cut output ends with the marker
``\\n… [truncated: N more bytes]`` where N also counts bytes the caller never captured.
"""

from __future__ import annotations

import re
from typing import Any

from activities.tools.base import ToolOutput
from sessionflow.models.common import TextContent

_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPE = re.compile(
    r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC ... BEL | ST
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"  # DCS, SOS, PM, APC ... ST
    r"|\x1b\[[0-?]*[ -/]*[@-~]?"  # CSI
    r"|\x9b[0-?]*[ -/]*[@-~]?"  # 8-bit CSI
    r"|\x1b[ -/]*[0-~]?"  # two-character and nF escapes, or a lone ESC
)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
TRUNCATION_MARKER = "\n… [truncated: {} more bytes]"


def normalize(data: bytes | str) -> str:
    """Text safe to show the model; see the module docstring for the rule."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    text = _SURROGATE.sub("\ufffd", text)
    text = _ESCAPE.sub("", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL.sub("", text)


def clip(data: bytes | str, cap: int, *, omitted: int = 0) -> tuple[str, int]:
    """Normalized text of at most ``cap`` UTF-8 bytes plus the marker, and the bytes cut.

    ``omitted`` is what the caller already dropped before handing us the data.
    """
    encoded = normalize(data).encode("utf-8")
    kept = encoded[:cap].decode("utf-8", "ignore")
    cut = len(encoded) - len(kept.encode("utf-8")) + omitted
    if cut <= 0:
        return kept, 0
    return kept + TRUNCATION_MARKER.format(cut), cut


def text_output(
    body: bytes | str,
    cap: int,
    *,
    omitted: int = 0,
    suffix: str = "",
    paths: tuple[str, ...] = (),
    store_cap: int | None = None,
    **structured: Any,
) -> ToolOutput:
    """The exit of every built-in: normalized, capped text plus structured data.

    ``suffix`` (a short note from the tool: an exit code, where to continue) follows the cap,
    so cutting a long body never cuts the note. With ``store_cap``, a cut body is also kept
    whole (up to that cap) for the store.
    """
    text, cut = clip(body, cap, omitted=omitted)
    full_text = None
    if cut:
        structured["truncated_bytes"] = cut
        if store_cap is not None and store_cap > cap:
            full_text, _ = clip(body, store_cap, omitted=omitted)
    suffix = normalize(suffix)
    if text.endswith("\n") and suffix.startswith("\n"):
        suffix = suffix[1:]
    content = (TextContent(text=text + suffix),)
    return ToolOutput(
        structured=structured, content=content, output_paths=paths, full_text=full_text
    )
