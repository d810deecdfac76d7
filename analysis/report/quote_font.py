"""The font the report embeds for the articles' quoted words: a subset of Noto Sans CJK SC holding exactly
the characters the claim registry quotes, so the Chinese renders in a browser without CJK fonts (a stock
Debian + Chromium shows empty boxes) and the report stays one self-contained, offline file.

The subset is committed (``reports/fonts/``, with the font's SIL Open Font License); regenerate it after
adding or changing a quote with ``python -m analysis.report.quote_font --source NotoSansCJK-Regular.ttc`` (the
Debian package fonts-noto-cjk has the collection; any Noto Sans CJK SC OpenType file works). A test checks
that the committed subset covers every quoted character; ``missing`` says which it lacks.
"""

from __future__ import annotations

import argparse
import base64
import io
import unicodedata
from collections.abc import Iterable
from pathlib import Path

from analysis import registry
from analysis.audit import Claim

ROOT = Path(__file__).resolve().parents[2]
FONT = ROOT / "reports" / "fonts" / "quotes-noto-sans-sc.woff"
FAMILY = "Quote Noto Sans SC"  # the CSS family name the report's quotes ask for
SC_NAME = "Noto Sans CJK SC"  # the face taken from a collection


def quoted_text(claims: Iterable[Claim] | None = None) -> str:
    """Every quote of ``claims`` (by default every claim the report shows, ``analysis.registry.claims``), one
    per line."""
    claims = registry.claims() if claims is None else claims
    return "\n".join(dict.fromkeys(q.text for c in claims for q in c.quotes))


def characters(text: str) -> set[str]:
    """The characters of ``text`` the subset is made of (white space is not drawn from it)."""
    return {ch for ch in text if not ch.isspace()}


def needs_font(ch: str) -> bool:
    """Whether a stock system may lack ``ch``: the wide and fullwidth characters (CJK ideographs, CJK
    punctuation, fullwidth forms). Latin, Greek and symbols come from the system's fonts when the subset
    lacks them."""
    return unicodedata.east_asian_width(ch) in ("W", "F")


def _codepoints(font_path: str | Path) -> set[int]:
    from fontTools.ttLib import TTFont

    with TTFont(font_path) as font:
        return set(font.getBestCmap())


def missing(text: str, font_path: str | Path = FONT) -> set[str]:
    """Wide characters of ``text`` (``needs_font``) the font has no glyph for (all of them when the font
    file is absent)."""
    chars = {ch for ch in characters(text) if needs_font(ch)}
    if not Path(font_path).is_file():
        return chars
    have = _codepoints(font_path)
    return {ch for ch in chars if ord(ch) not in have}


def css_face(font_path: str | Path = FONT) -> str:
    """An ``@font-face`` rule with the font inlined as a data URI ("" when the file is absent: the quotes
    then fall back to the system's fonts)."""
    path = Path(font_path)
    if not path.is_file():
        return ""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (
        f'@font-face {{ font-family: "{FAMILY}"; font-display: block; '
        f'src: url(data:font/woff;base64,{data}) format("woff"); }}'
    )


def _open_face(source: str | Path):
    from fontTools.ttLib import TTCollection, TTFont

    if str(source).lower().endswith((".ttc", ".otc")):
        faces = TTCollection(source).fonts
        for face in faces:
            if face["name"].getDebugName(1) == SC_NAME or face["name"].getDebugName(4) == SC_NAME:
                return face
        raise ValueError(f"{source}: no {SC_NAME!r} face in this collection")
    return TTFont(source)


def build(source: str | Path, out: str | Path = FONT, text: str | None = None) -> Path:
    """Write the subset of ``source`` holding the characters of ``text`` (default: every quote of the
    registry) as WOFF to ``out``; the name table keeps the font's copyright and license records."""
    from fontTools import subset

    text = quoted_text() if text is None else text
    face = _open_face(source)
    options = subset.Options()
    options.flavor = "woff"
    options.layout_features = ["*"]
    options.name_IDs = [0, 1, 2, 3, 4, 5, 6, 13, 14]
    options.notdef_outline = True
    subsetter = subset.Subsetter(options)
    subsetter.populate(text="".join(sorted(characters(text))))
    subsetter.subset(face)
    buf = io.BytesIO()
    face.flavor = "woff"
    face.save(buf)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(buf.getvalue())
    lacking = missing(text, out)
    if lacking:
        raise ValueError(f"{source} has no glyph for {''.join(sorted(lacking))!r}")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", required=True, help="a Noto Sans CJK SC font or collection (.otf/.ttc)")
    ap.add_argument("--out", default=str(FONT))
    args = ap.parse_args(argv)
    path = build(args.source, args.out)
    print(f"{path}: {len(characters(quoted_text()))} characters, {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
