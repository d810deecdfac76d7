"""The articles' math in the report: the committed MathML file (analysis/audit/quotes_math.json) against the
claim files, the way a quote is split into text and formulas, and the font subsets the math is drawn with."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest
from markupsafe import Markup

from analysis.report import quote_font, quote_math

# MathML Core's elements and the attributes the converter writes: anything else (a script, an event handler,
# HTML) does not belong in the file the report inserts as markup
MATHML = set(
    "math mrow mi mn mo mtext ms mspace msub msup msubsup munder mover munderover mfrac msqrt mroot mstyle mpadded "
    "mphantom menclose mtable mtr mtd semantics annotation".split()
)
ATTRIBUTES = set(
    "xmlns display stretchy fence form mathvariant movablelimits accent accentunder separator width lspace rspace "
    "linethickness displaystyle scriptlevel encoding".split()
)


class _Elements(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[str] = []
        self.attrs: set[str] = set()
        self.roots = 0
        self.depth = 0

    def handle_starttag(self, tag, attrs):
        self.roots += self.depth == 0
        self.depth += 1
        self.tags.append(tag)
        self.attrs |= {a for a, _ in attrs}

    def handle_endtag(self, tag):
        self.depth -= 1


def test_the_file_covers_every_quote_holding_latex_and_nothing_else():
    latex = quote_math.latex_quotes()
    assert len(latex) > 30  # the articles' formulas and inline math
    missing = set(latex) - set(quote_math.converted())
    assert not missing, f"regenerate {quote_math.FILE.name} ({quote_math.COMMAND}): it lacks {sorted(missing)[:3]}"
    stale = set(quote_math.converted()) - set(latex)
    assert not stale, f"regenerate {quote_math.FILE.name} ({quote_math.COMMAND}): no claim quotes {sorted(stale)[:3]}"
    header = json.loads(quote_math.FILE.read_text(encoding="utf-8"))
    assert quote_math.COMMAND in header["regenerate"] and header["converter"].startswith(quote_math.CONVERTER)


def test_each_quote_keeps_its_words_and_its_math_is_one_mathml_element():
    for text, parts in quote_math.converted().items():
        want = quote_math.segments(text)
        assert [kind == "math" for kind, _ in parts] == [math for math, _ in want], text
        assert [p for kind, p in parts if kind == "text"] == [p for math, p in want if not math], text
        for kind, html in parts:
            if kind != "math":
                continue
            elements = _Elements()
            elements.feed(html)
            assert elements.roots == 1 and elements.tags[0] == "math", html
            assert set(elements.tags) <= MATHML and elements.attrs <= ATTRIBUTES, html
    # a whole formula is set as a display, inline math inline
    formula = r"\text{IO}_{\text{standard}} = \Theta(N d + N^2)"
    assert 'display="block"' in quote_math.converted()[formula][0][1]
    inline = next(t for t in quote_math.converted() if t.startswith("显存阶跃爆炸"))
    assert all('display="inline"' in p for kind, p in quote_math.converted()[inline] if kind == "math")


def test_regenerating_the_file_gives_the_same_file():
    pytest.importorskip(quote_math.CONVERTER)
    from importlib.metadata import version

    recorded = json.loads(quote_math.FILE.read_text(encoding="utf-8"))["converter"]
    if recorded != f"{quote_math.CONVERTER} {version(quote_math.CONVERTER)}":
        pytest.skip(f"the file was made with {recorded}, {version(quote_math.CONVERTER)} is installed")
    assert quote_math.dumps(quote_math.generate()) == quote_math.FILE.read_text(encoding="utf-8")


def test_a_quote_is_a_formula_or_text_with_inline_math():
    assert quote_math.segments(r"I = \frac{a}{b}") == [(True, r"I = \frac{a}{b}")]
    assert quote_math.segments("长度 $N$ 满足 $N \\ge 512$ 。") == [
        (False, "长度 "),
        (True, "N"),
        (False, " 满足 "),
        (True, r"N \ge 512"),
        (False, " 。"),
    ]
    assert quote_math.segments("BLOCK_M, BLOCK_N = 64, 64") == [(False, "BLOCK_M, BLOCK_N = 64, 64")]
    assert not quote_math.holds_latex("exp(m_i - m_new)，O(N^2)") and quote_math.holds_latex(r"\Theta(N)")
    with pytest.raises(ValueError, match=r"quote '\$a\$ costs \$5': an odd number of '\$'"):
        quote_math.segments("$a$ costs $5")


def test_the_report_gets_the_math_as_markup_and_plain_quotes_as_none(tmp_path):
    formula = r"\text{IO}_{\text{standard}} = \Theta(N d + N^2)"
    ((kind, html),) = quote_math.parts(formula)
    assert kind == "math" and isinstance(html, Markup) and html.startswith("<math")
    assert quote_math.parts("FP16 精度对齐用 atol=1e-2") is None  # no LaTeX
    assert quote_math.parts(r"\frac{1}{2} \text{ not quoted}") is None  # LaTeX the file does not hold
    assert quote_math.parts(formula, tmp_path / "absent.json") is None
    broken = tmp_path / "quotes_math.json"
    broken.write_text('{"quotes": {"x": "<math></math>"}}', encoding="utf-8")
    with pytest.raises(ValueError, match="quotes_math.json: has no 'quotes' object of quote text -> parts"):
        quote_math.parts(r"\x", broken)


def test_the_characters_the_math_draws_include_the_italic_identifiers():
    html = (
        '<math><mrow><mi>N</mi><mo>&#x000D7;</mo><mi mathvariant="normal">d</mi><mi>&#x00398;</mi>'
        "<mn>12</mn><mtext>&#x000A0;个元素</mtext><mi>lim</mi></mrow></math>"
    )
    drawn = quote_math.drawn_characters([html, "<p>not math</p>"])
    # N and Θ drawn italic (math-auto), d upright as asked, white space and text outside <math> not drawn
    assert drawn == set("N×dΘ12个元素lim") | {"\U0001d441", "\U0001d6e9"}
    assert quote_math.math_italic("h") == "\u210e" and quote_math.math_italic("⌈") is None


def test_the_committed_fonts_draw_every_character_of_the_math():
    math = quote_font.math_characters()
    assert {"×", "≈", "⌈", "∞", "\U0001d441"} <= math  # \times, \approx, \lceil, \infty, an italic N
    assert quote_font.missing_math(math) == set(), "regenerate the fonts: python -m analysis.report.quote_font ..."
    # the math's own subset holds only what the math draws: not the quotes' Chinese, not unused symbols
    in_math = {chr(c) for c in quote_font._codepoints(quote_font.MATH.file)}
    assert "∑" not in in_math and "显" not in in_math and quote_font.missing_math({"∑"}) == {"∑"}
    assert quote_font.missing_math(math, ()) == math  # no font, nothing drawn
    faces = quote_font.css_faces()
    assert faces.count("@font-face") == 2 and quote_font.MATH.family in faces and quote_font.QUOTES.family in faces
