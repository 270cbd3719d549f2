"""Rebuild tests/data/token_corpus_v2/passages.jsonl: the token counter's accuracy corpus.

    .venv/bin/python -m tests.support.build_token_corpus      # rewrites the file
    .venv/bin/python -m tests.support.build_token_corpus --check   # rebuilds in memory, compares

Where the passages come from (only text whose licence allows redistribution):
- ``readme-md`` / ``readme-rst`` / ``readme-text``: the long description (README) in the METADATA of
  the packages installed in .venv by ``pip install -e .[test]``, under MIT, BSD, Apache, ISC, PSF,
  MPL, 0BSD or Unlicense licences (read from License-Expression, License or the classifiers);
- ``license``: those packages' own licence files (LICENSE, COPYING, NOTICE...), and the Apache-2.0,
  BSD, MPL-2.0, CC0 and Artistic texts of /usr/share/common-licenses (GPL-family texts are left
  out: they may be copied only verbatim and whole);
- ``api-doc``: docstrings of the standard library's modules, classes and functions (PSF-2.0);
- ``api-doc-rst``: docstrings of the installed packages that use reStructuredText/Sphinx markup
  (``:class:`x```, ``inline code``, `links <...>`_);
- ``node-readme``: READMEs of the npm packages installed by package.json (MIT/ISC...);
- ``prose``: tests/data/token_corpus, paywire's own passages (news, email, dialogue, fiction...);
- ``code-python`` / ``code-js``: source with its comments from the same packages;
- ``non-english`` / ``emoji``: short passages written for paywire (below) and the BIP-39 word
  lists shipped by eth-account (MIT), for the exactness tests.
Man pages are not used: most on this machine are GPL.

The selection is deterministic: sources are read in sorted order, each document is cut into
passages of 300-3,000 characters at paragraph (then line) boundaries, each passage gets the id
``kind:source:n``, duplicates (same text once whitespace is collapsed) are dropped, and each kind
keeps its first ``QUOTA`` passages in sha256(id) order. Text is UTF-8, newlines ``\\n``.

The split (``split_of``): a passage is in the calibration half when the first byte of sha256(id)
is even, in the held-out half otherwise. Anything fitted (multipliers) is fitted on the
calibration half only; the accuracy bar is asserted on the held-out half.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata as md
import json
import re
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
OUT = ROOT / "tests" / "data" / "token_corpus_v2" / "passages.jsonl"
OLD_CORPUS = ROOT / "tests" / "data" / "token_corpus"
NODE_MODULES = ROOT / "node_modules"
COMMON_LICENSES = Path("/usr/share/common-licenses")
MIN_CHARS, MAX_CHARS = 300, 3000

# Passages kept per kind (the English kinds are the accuracy corpus; the others are for the
# exactness tests only).
QUOTA = {
    "readme-md": 130,
    "readme-rst": 70,
    "readme-text": 10,
    "license": 70,
    "api-doc": 110,
    "api-doc-rst": 100,
    "node-readme": 30,
    "prose": 72,
    "code-python": 30,
    "code-js": 12,
    "non-english": 100,  # all of them
    "emoji": 100,
}
ENGLISH_KINDS = frozenset(
    {"readme-md", "readme-rst", "readme-text", "license", "api-doc", "api-doc-rst", "node-readme", "prose"}
)
PER_DOCUMENT = {"readme": 4, "license": 2, "api-doc": 1, "api-doc-rst": 3, "code": 1, "node-readme": 3}

_PERMISSIVE = re.compile(
    r"\b(MIT|BSD|Apache|ISC|PSF|Python Software Foundation|MPL|Mozilla Public|0BSD|Unlicense|CC0)",
    re.IGNORECASE,
)
_COPYLEFT = re.compile(r"\b(A?GPL|LGPL|General Public)", re.IGNORECASE)
_RST_MARKUP = re.compile(r":[a-z]+:`|``[^`]+``|`[^`<]+<[^>]+>`_|^\.\. [a-z]+::", re.MULTILINE)


def split_of(passage_id: str) -> str:
    """'calibration' when the first byte of sha256(id) is even, else 'held-out'."""
    return "calibration" if hashlib.sha256(passage_id.encode()).digest()[0] % 2 == 0 else "held-out"


def _order_key(passage_id: str) -> str:
    return hashlib.sha256(("order:" + passage_id).encode()).hexdigest()


def _clean(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    return "\n".join(line.rstrip() for line in text.split("\n")).strip("\n")


def passages(document: str) -> list[str]:
    """Cut a document into passages of MIN..MAX characters at blank lines, then lines."""
    blocks: list[str] = []
    for para in re.split(r"\n\s*\n", _clean(document)):
        if len(para) <= MAX_CHARS:
            blocks.append(para)
            continue
        current = ""
        for line in para.split("\n"):
            if current and len(current) + len(line) + 1 > MAX_CHARS:
                blocks.append(current)
                current = ""
            current = f"{current}\n{line}" if current else line[:MAX_CHARS]
        if current:
            blocks.append(current)
    out: list[str] = []
    current = ""
    # A target between MIN and MAX that varies with the document, so lengths vary.
    target = 500 + int(hashlib.sha256(document[:200].encode()).hexdigest(), 16) % 1500
    for block in blocks:
        if current and len(current) + 2 + len(block) > MAX_CHARS:
            if len(current) >= MIN_CHARS:
                out.append(current)
            current = ""
        current = f"{current}\n\n{block}" if current else block
        if len(current) >= target:
            out.append(current)
            current = ""
    if len(current) >= MIN_CHARS:
        out.append(current)
    return [p for p in out if MIN_CHARS <= len(p) <= MAX_CHARS and p.strip()]


def _license_of(dist: md.Distribution) -> str | None:
    meta = dist.metadata
    declared = meta.get("License-Expression") or ""
    if not declared:
        licence = (meta.get("License") or "").strip()
        declared = licence.split("\n", 1)[0][:80] if licence and len(licence) < 200 else ""
    classifiers = [
        c.rsplit("::", 1)[-1].strip() for c in meta.get_all("Classifier") or [] if c.startswith("License")
    ]
    text = " ".join([declared, *classifiers]).strip()
    if not text or _COPYLEFT.search(text) or not _PERMISSIVE.search(text):
        return None
    return declared or "; ".join(classifiers)


def _distributions() -> list[tuple[str, md.Distribution, str]]:
    seen: dict[str, tuple[str, md.Distribution, str]] = {}
    for dist in md.distributions():
        name = (dist.metadata.get("Name") or "").lower().replace("_", "-")
        licence = _license_of(dist)
        if name and licence and name not in seen and name != "paywire":
            seen[name] = (name, dist, licence)
    return [seen[k] for k in sorted(seen)]


Doc = tuple[str, str, str, str, int]  # kind, source, licence, text, passages at most


def _readmes(dists: list[tuple[str, md.Distribution, str]]) -> Iterator[Doc]:
    for name, dist, licence in dists:
        body = dist.metadata.get_payload() or dist.metadata.get("Description") or ""  # type: ignore[attr-defined]
        kind_of = (dist.metadata.get("Description-Content-Type") or "").lower()
        if "markdown" in kind_of:
            kind = "readme-md"
        elif "rst" in kind_of or _RST_MARKUP.search(body):
            kind = "readme-rst"
        else:
            kind = "readme-text"
        yield kind, f"{name}/METADATA", licence, body, PER_DOCUMENT["readme"]


def _license_files(dists: list[tuple[str, md.Distribution, str]]) -> Iterator[Doc]:
    for name, dist, licence in dists:
        for file in sorted(dist.files or [], key=str):
            if re.match(r"(LICEN[CS]E|COPYING|NOTICE)", file.name, re.IGNORECASE) and ".dist-info" in str(
                file
            ):
                path = Path(str(dist.locate_file(file)))
                if path.is_file() and path.stat().st_size < 200_000:
                    yield "license", f"{name}/{file.name}", licence, path.read_text("utf-8", "replace"), 2
    for stem in ("Apache-2.0", "BSD", "MPL-2.0", "CC0-1.0", "Artistic"):
        path = COMMON_LICENSES / stem
        if path.is_file():
            yield "license", f"common-licenses/{stem}", stem, path.read_text("utf-8", "replace"), 4


def _docstrings(path: Path) -> Iterator[str]:
    try:
        tree = ast.parse(path.read_text("utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc and len(doc) >= MIN_CHARS:
                yield doc


def _stdlib_docs() -> Iterator[Doc]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    skip = ("test", "idlelib", "lib2to3", "site-packages", "turtledemo", "tkinter", "ensurepip")
    for path in sorted(stdlib.rglob("*.py")):
        rel = path.relative_to(stdlib)
        if rel.parts[0] in skip or "tests" in rel.parts:
            continue
        for i, doc in enumerate(_docstrings(path)):
            yield "api-doc", f"python{sys.version_info[0]}.{sys.version_info[1]}/{rel}#{i}", "PSF-2.0", doc, 1


def _package_modules(dist: md.Distribution) -> list[Path]:
    return [
        Path(str(dist.locate_file(f)))
        for f in sorted(dist.files or [], key=str)
        if f.suffix == ".py" and "/tests/" not in f"/{f}" and "_vendor" not in str(f)
    ]


def _package_docs(dists: list[tuple[str, md.Distribution, str]]) -> Iterator[Doc]:
    for name, dist, licence in dists:
        found = 0
        for path in _package_modules(dist):
            if found >= PER_DOCUMENT["api-doc-rst"] or not path.is_file():
                break
            for i, doc in enumerate(_docstrings(path)):
                if len(_RST_MARKUP.findall(doc)) >= 3:
                    yield "api-doc-rst", f"{name}/{path.name}#{i}", licence, doc, 1
                    found += 1
                    if found >= PER_DOCUMENT["api-doc-rst"]:
                        break


def _python_code(dists: list[tuple[str, md.Distribution, str]]) -> Iterator[Doc]:
    for name, dist, licence in dists:
        for path in _package_modules(dist):
            if path.is_file() and 3_000 < path.stat().st_size < 200_000:
                source = path.read_text("utf-8", "replace")
                if source.count("#") >= 10:
                    yield "code-python", f"{name}/{path.name}", licence, source, 1
                    break


def _node_docs() -> Iterator[Doc]:
    for package_json in sorted(NODE_MODULES.glob("**/package.json")):
        folder = package_json.parent
        if folder.parent.name not in ("node_modules",) and folder.parent.parent.name != "node_modules":
            continue
        try:
            meta = json.loads(package_json.read_text("utf-8"))
        except (ValueError, UnicodeDecodeError):
            continue
        licence = meta.get("license") if isinstance(meta.get("license"), str) else None
        name = meta.get("name")
        if (
            not isinstance(name, str)
            or not licence
            or _COPYLEFT.search(licence)
            or not _PERMISSIVE.search(licence)
        ):
            continue
        for readme in sorted(folder.glob("[Rr][Ee][Aa][Dd][Mm][Ee]*.md")):
            yield "node-readme", f"npm:{name}/{readme.name}", licence, readme.read_text("utf-8", "replace"), 3
        main = folder / str(meta.get("main") or "index.js")
        if main.suffix == ".js" and main.is_file() and 2_000 < main.stat().st_size < 300_000:
            yield "code-js", f"npm:{name}/{main.name}", licence, main.read_text("utf-8", "replace"), 1


def _old_corpus() -> Iterator[Doc]:
    for path in sorted(OLD_CORPUS.glob("*.txt")):
        # One passage per file, whatever its length (some are under 300 characters).
        yield "prose", f"token_corpus/{path.name}", "paywire (original)", path.read_text("utf-8"), 0


def _wordlists(dists: list[tuple[str, md.Distribution, str]]) -> Iterator[Doc]:
    for name, dist, licence in dists:
        if name != "eth-account":
            continue
        for file in sorted(dist.files or [], key=str):
            if "wordlist" in str(file) and file.suffix == ".txt" and "english" not in file.name:
                words = Path(str(dist.locate_file(file))).read_text("utf-8").split()
                for start in (0, 700, 1400):
                    text = " ".join(words[start : start + 120])
                    yield "non-english", f"{name}/{file.name}@{start}", licence, text, 0


# Written for paywire (licence: paywire's own), in the languages and scripts a gateway sees.
AUTHORED = {
    "non-english": [
        "La pasarela cobra cada llamada por separado: el agente envía su petición, recibe una"
        " cotización exacta y paga en USDC antes de que el modelo responda. Si el pago falla,"
        " no se ejecuta nada y el agente puede volver a intentarlo más tarde, sin cargos dobles.",
        "Le compteur de jetons doit être exact pour les encodages d'OpenAI : on facture à"
        " l'appel, et un écart de quelques pour cent sur des milliers de requêtes finit par coûter"
        " cher. « Mieux vaut compter juste que compter vite », disait déjà l'équipe — même si"
        " l'un n'empêche pas l'autre.",
        "Die Abrechnung erfolgt pro Aufruf. Jeder Agent erhält vorab ein verbindliches Angebot,"
        " zahlt über x402 und bekommt erst danach die Antwort des Modells. Größere Eingaben kosten"
        " mehr; übermäßig lange Texte werden mit einer Fehlermeldung abgewiesen, die das Feld nennt.",
        "O gateway cobra por chamada. Cada agente recebe uma cotação antes de pagar, e a resposta"
        " só é entregue depois que o pagamento é liquidado na rede. Não há assinaturas mensais,"
        " nem contas: apenas uma carteira e um pouco de USDC.",
        "Шлюз принимает оплату за каждый вызов отдельно. Агент отправляет запрос, получает"
        " точную цену и платит в USDC; только после этого модель начинает отвечать. Если платёж"
        " не прошёл, ничего не выполняется, и повторная попытка ничего не стоит.",
        "Η πύλη χρεώνει κάθε κλήση ξεχωριστά. Ο πράκτορας στέλνει το αίτημα, λαμβάνει μια"
        " ακριβή τιμή και πληρώνει σε USDC πριν απαντήσει το μοντέλο. Αν η πληρωμή αποτύχει,"
        " δεν εκτελείται τίποτα.",
        "تفرض البوابة رسومًا على كل استدعاء على حدة. يرسل الوكيل طلبه، ويتلقى سعرًا دقيقًا،"
        " ثم يدفع بعملة USDC قبل أن يجيب النموذج. إذا فشل الدفع فلن يُنفَّذ أي شيء.",
        "השער גובה תשלום על כל קריאה בנפרד. הסוכן שולח בקשה, מקבל הצעת מחיר מדויקת ומשלם"
        " ב-USDC לפני שהמודל עונה. אם התשלום נכשל, דבר אינו מתבצע.",
        "गेटवे हर कॉल के लिए अलग से शुल्क लेता है। एजेंट अनुरोध भेजता है, सटीक कीमत पाता है और"
        " मॉडल के जवाब देने से पहले USDC में भुगतान करता है। भुगतान विफल होने पर कुछ भी नहीं चलता।",
        "网关按次收费。代理发送请求，收到准确的报价，然后在模型回答之前用 USDC 付款。如果付款失败，"
        "什么都不会执行，重试也不会重复扣费。令牌计数对于 OpenAI 的编码必须完全准确。",
        "ゲートウェイは呼び出しごとに課金します。エージェントはリクエストを送り、正確な見積もりを"
        "受け取り、モデルが答える前に USDC で支払います。支払いに失敗した場合、何も実行されません。",
        "게이트웨이는 호출마다 요금을 받습니다. 에이전트가 요청을 보내면 정확한 견적을 받고, 모델이"
        " 답하기 전에 USDC로 결제합니다. 결제가 실패하면 아무것도 실행되지 않습니다.",
        "Ağ geçidi her çağrı için ayrı ücret alır. Ajan isteğini gönderir, kesin bir fiyat alır ve"
        " model yanıt vermeden önce USDC ile öder. Ödeme başarısız olursa hiçbir şey çalıştırılmaz.",
        "Cổng thanh toán tính phí cho từng lệnh gọi. Tác nhân gửi yêu cầu, nhận báo giá chính xác"
        " và thanh toán bằng USDC trước khi mô hình trả lời. Nếu thanh toán thất bại, không có gì"
        " được thực thi.",
        "Brama pobiera opłatę za każde wywołanie osobno. Agent wysyła żądanie, otrzymuje dokładną"
        " wycenę i płaci w USDC, zanim model odpowie. Jeśli płatność się nie powiedzie, nic nie"
        " zostanie wykonane.",
        "เกตเวย์คิดค่าบริการแยกตามการเรียกแต่ละครั้ง เอเจนต์ส่งคำขอ ได้รับราคาที่แน่นอน และชำระเป็น"
        " USDC ก่อนที่โมเดลจะตอบ หากการชำระเงินล้มเหลว จะไม่มีอะไรถูกดำเนินการ",
        "Il gateway addebita ogni chiamata separatamente: l'agente invia la richiesta, riceve un"
        " preventivo esatto e paga in USDC prima che il modello risponda. Se il pagamento non va a"
        " buon fine, non viene eseguito nulla.",
        "Mixed: the quote says 1.250000 USDC; la cotización dice lo mismo; 見積もりは同じです;"
        " цена та же; السعر نفسه. Zero-width joiner: a\u200db, non-breaking space: a\u00a0b,"
        " combining: e\u0301 vs \u00e9, Å vs A\u030a.",
    ],
    "emoji": [
        "Paid! 🎉💸 Your call went through ✅ — 3 tokens in, 12 out 🚀🚀🚀. Next: 🤖➡️🧠➡️📦",
        "Family: 👨\u200d👩\u200d👧\u200d👦, flags: 🇫🇷🇯🇵🇧🇷🇺🇸, skin tones: 👍🏻👍🏽👍🏿, keycaps: 1️⃣2️⃣#️⃣,"
        " hearts: ❤️🧡💛💚💙💜🖤🤍, weather: ☀️🌤️⛅🌧️⛈️🌩️❄️",
        "Release notes ✨\n\n- 🐛 fixed the quote rounding\n- ⚡️ 2x faster counting\n- 🔒 no key in"
        " logs\n- 📝 docs 📚\n- 🧪 tests: 600 passages 🧾\n- 🙏 thanks to every contributor 🫶",
        "Status: 🟢 devnet, 🟡 mainnet (degraded), 🔴 facilitator down. Math: ∑ ∫ √ ∞ ≈ ≠ ≤ ≥ ±"
        " × ÷ → ⇒ ∀ ∃ ∈ ∉; arrows ←↑→↓↔; box ┌─┐│└─┘; music 𝄞 ♩♪♫♬; CJK ext 𠀀𠀁.",
    ],
}


def _authored() -> Iterator[Doc]:
    for kind, texts in AUTHORED.items():
        for i, text in enumerate(texts):
            yield kind, f"paywire-authored/{kind}#{i}", "paywire (original)", text, 0


def _documents() -> Iterator[Doc]:
    dists = _distributions()
    yield from _readmes(dists)
    yield from _license_files(dists)
    yield from _stdlib_docs()
    yield from _package_docs(dists)
    yield from _python_code(dists)
    yield from _node_docs()
    yield from _old_corpus()
    yield from _wordlists(dists)
    yield from _authored()


def build() -> list[dict[str, str]]:
    candidates: dict[str, list[dict[str, str]]] = {kind: [] for kind in QUOTA}
    seen: set[str] = set()
    ids: set[str] = set()
    for kind, source, licence, text, limit in _documents():
        # limit 0: the document is one passage as it is (authored, old corpus, word lists).
        pieces = [_clean(text)] if limit == 0 else passages(text)
        if limit and len(pieces) > limit:
            step = len(pieces) / limit  # spread over the document, not just its start
            pieces = [pieces[int(i * step)] for i in range(limit)]
        for n, piece in enumerate(pieces):
            digest = hashlib.sha256(" ".join(piece.split()).encode()).hexdigest()
            if digest in seen or not piece.strip():
                continue
            seen.add(digest)
            passage_id = f"{kind}:{source}:{n}"
            while passage_id in ids:  # same file name in two folders of one package
                passage_id += "+"
            ids.add(passage_id)
            candidates[kind].append(
                {"id": passage_id, "source": source, "kind": kind, "license": licence, "text": piece}
            )
    records: list[dict[str, str]] = []
    for kind, quota in QUOTA.items():
        chosen = sorted(candidates[kind], key=lambda r: _order_key(r["id"]))[:quota]
        records.extend(sorted(chosen, key=lambda r: r["id"]))
    for record in records:
        record["split"] = split_of(record["id"])
    return records


def dump(records: list[dict[str, str]]) -> str:
    keys = ("id", "kind", "split", "source", "license", "text")
    return "".join(json.dumps({k: r[k] for k in keys}, ensure_ascii=False) + "\n" for r in records)


def main() -> int:
    text = dump(build())
    if "--check" in sys.argv[1:]:
        same = OUT.is_file() and OUT.read_text("utf-8") == text
        print("corpus is up to date" if same else f"{OUT} differs from a rebuild")
        return 0 if same else 1
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text, "utf-8")
    counts: dict[str, int] = {}
    for line in text.splitlines():
        kind = json.loads(line)["kind"]
        counts[kind] = counts.get(kind, 0) + 1
    print(f"{sum(counts.values())} passages, {len(text.encode()) / 1e6:.2f} MB -> {OUT.relative_to(ROOT)}")
    for kind, n in counts.items():
        print(f"  {kind:<12} {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
