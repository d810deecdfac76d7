"""The fonts the report embeds for the articles' quoted words and their math: subsets of Noto Sans CJK SC (the
quotes' characters) and Noto Sans Math (the characters the quotes' MathML draws, ``analysis.report.quote_math``),
so the Chinese and the formulas render in a browser without CJK or math fonts (a stock Debian + Chromium shows
empty boxes) and the report stays one self-contained, offline file.

The subsets are committed (``reports/fonts/``, with the fonts' SIL Open Font License); regenerate them after
adding or changing a quote (and, for a quote holding LaTeX, its MathML first) with::

    python -m analysis.report.quote_font --source NotoSansCJK-Regular.ttc --math-source NotoSansMath-Regular.ttf

(the Debian packages fonts-noto-cjk and fonts-noto-core have them; any Noto Sans CJK SC and Noto Sans Math
OpenType file works). The math subset holds what Noto Sans Math has of the math's characters, the quotes' subset
every quoted character and the math's remaining ones. Tests check that the committed subsets cover every quoted
wide character and every character of the math; ``missing`` and ``missing_math`` say which they lack.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import io
import unicodedata
from collections.abc import Iterable
from pathlib import Path

from analysis import registry
from analysis.audit import Claim
from analysis.report import quote_math

ROOT = Path(__file__).resolve().parents[2]
FONTS = ROOT / "reports" / "fonts"


@dataclasses.dataclass(frozen=True)
class Face:
    family: str  # the CSS family name the report asks for
    file: Path  # the committed subset (WOFF)
    name: str  # the family name of the source font (the face taken from a collection)


QUOTES = Face("Quote Noto Sans SC", FONTS / "quotes-noto-sans-sc.woff", "Noto Sans CJK SC")
MATH = Face("Quote Noto Sans Math", FONTS / "quotes-noto-sans-math.woff", "Noto Sans Math")
FONT, FAMILY = QUOTES.file, QUOTES.family


def quoted_text(claims: Iterable[Claim] | None = None) -> str:
    """Every quote of ``claims`` (by default every claim the report shows, ``analysis.registry.claims``), one
    per line."""
    claims = registry.claims() if claims is None else claims
    return "\n".join(dict.fromkeys(q.text for c in claims for q in c.quotes))


def math_characters(claims: Iterable[Claim] | None = None, path: str | Path = quote_math.FILE) -> set[str]:
    """The characters the MathML of the quotes of ``claims`` draws (``quote_math.drawn_characters``)."""
    converted = quote_math.converted(path)
    return quote_math.drawn_characters(
        v for t in quote_math.latex_quotes(claims) for kind, v in converted.get(t, []) if kind == "math"
    )


def characters(text: str) -> set[str]:
    """The characters of ``text`` a subset is made of (white space is not drawn from it)."""
    return {ch for ch in text if not ch.isspace()}


def needs_font(ch: str) -> bool:
    """Whether a stock system may lack ``ch``: the wide and fullwidth characters (CJK ideographs, CJK
    punctuation, fullwidth forms). Latin, Greek and symbols of the quotes' text come from the system's fonts
    when the subset lacks them."""
    return unicodedata.east_asian_width(ch) in ("W", "F")


def _codepoints(font_path: str | Path) -> set[int]:
    from fontTools.ttLib import TTFont

    with TTFont(font_path) as font:
        return set(font.getBestCmap())


def missing(text: str, font_path: str | Path = QUOTES.file) -> set[str]:
    """Wide characters of ``text`` (``needs_font``) the font has no glyph for (all of them when the font
    file is absent)."""
    chars = {ch for ch in characters(text) if needs_font(ch)}
    if not Path(font_path).is_file():
        return chars
    have = _codepoints(font_path)
    return {ch for ch in chars if ord(ch) not in have}


def missing_math(chars: Iterable[str], fonts: Iterable[str | Path] = (MATH.file, QUOTES.file)) -> set[str]:
    """Characters of the math (``chars``) that none of ``fonts`` (the faces the math is drawn with, in the
    report's order) has a glyph for; an absent file has none."""
    have: set[int] = set()
    for f in fonts:
        if Path(f).is_file():
            have |= _codepoints(f)
    return {ch for ch in chars if ord(ch) not in have}


def css_face(font_path: str | Path = QUOTES.file, family: str = QUOTES.family) -> str:
    """An ``@font-face`` rule with the font inlined as a data URI ("" when the file is absent: the text
    then falls back to the system's fonts)."""
    path = Path(font_path)
    if not path.is_file():
        return ""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (
        f'@font-face {{ font-family: "{family}"; font-display: block; '
        f'src: url(data:font/woff;base64,{data}) format("woff"); }}'
    )


def css_faces() -> str:
    """The ``@font-face`` rules of the quotes' and the math's subsets."""
    return "\n".join(css_face(f.file, f.family) for f in (QUOTES, MATH))


def _open_face(source: str | Path, name: str):
    """The face ``name`` of a font file or collection (an error naming the file when it is another font)."""
    from fontTools.ttLib import TTCollection, TTFont

    faces = TTCollection(source).fonts if str(source).lower().endswith((".ttc", ".otc")) else [TTFont(source)]
    for face in faces:
        if name in (face["name"].getDebugName(i) for i in (1, 4, 16)):
            return face
    raise ValueError(f"{source}: no {name!r} face in this font")


def _subset(source: str | Path, name: str, chars: Iterable[str], out: Path) -> Path:
    """Write the subset of the face ``name`` of ``source`` holding ``chars`` as WOFF to ``out``; the name table
    keeps the font's copyright and license records."""
    from fontTools import subset

    face = _open_face(source, name)
    options = subset.Options()
    options.flavor = "woff"
    options.layout_features = ["*"]
    options.name_IDs = [0, 1, 2, 3, 4, 5, 6, 13, 14]
    options.notdef_outline = True
    subsetter = subset.Subsetter(options)
    subsetter.populate(text="".join(sorted(chars)))
    subsetter.subset(face)
    buf = io.BytesIO()
    face.flavor = "woff"
    face.recalcTimestamp = False  # the source's dates: the same sources give the same bytes
    face.save(buf)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(buf.getvalue())
    return out


def build(
    source: str | Path,
    math_source: str | Path,
    out_dir: str | Path = FONTS,
    text: str | None = None,
    math: set[str] | None = None,
) -> tuple[Path, Path]:
    """Write both subsets to ``out_dir``: of ``math_source`` (Noto Sans Math) the characters of ``math`` it has
    (default: what the quotes' MathML draws), of ``source`` (Noto Sans CJK SC) the characters of ``text``
    (default: every quote of the registry) and the rest of ``math``. Returns (quotes' subset, math subset)."""
    text = quoted_text() if text is None else text
    math = math_characters() if math is None else math
    out_dir = Path(out_dir)
    math_cmap = set(_open_face(math_source, MATH.name).getBestCmap())
    in_math = {ch for ch in math if ord(ch) in math_cmap}
    math_out = _subset(math_source, MATH.name, in_math, out_dir / MATH.file.name)
    quotes_out = _subset(source, QUOTES.name, characters(text) | (math - in_math), out_dir / QUOTES.file.name)
    lacking = missing(text, quotes_out) | missing_math(math, (math_out, quotes_out))
    if lacking:
        raise ValueError(f"{source} and {math_source} have no glyph for {''.join(sorted(lacking))!r}")
    return quotes_out, math_out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", required=True, help="a Noto Sans CJK SC font or collection (.otf/.ttc)")
    ap.add_argument("--math-source", required=True, help="a Noto Sans Math font (.ttf/.otf)")
    ap.add_argument("--out-dir", default=str(FONTS))
    args = ap.parse_args(argv)
    for path in build(args.source, args.math_source, args.out_dir):
        print(f"{path}: {len(_codepoints(path))} characters, {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
