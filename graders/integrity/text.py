"""Contamination screening: does text the agent put into its jobs hold hidden-split items?

Standard library only. The method is decon's (and the GPT-3 paper's 13-gram check): both sides are
normalised (JSON and string escapes undone, NFKC, casefold, letter-or-digit word tokens), so changes
of whitespace, case, punctuation or quoting do not hide a copy; each hidden item is cut into
overlapping n-grams of `ngram` tokens, long enough that finding one in the agent's text means a copy,
not a common phrase. An item shorter than `ngram` tokens is one n-gram of its whole length (matched
whole); an item shorter than `min_item_tokens` is not screened: a match would mean nothing.

The tolerance `max_overlap` is the share of an item's distinct n-grams that may occur in the agent's
text (the union over every source scanned) before the item counts as contaminated: at 0.5, a shared
sentence passes and an item more than half copied does not. An item matched whole is found or not.
"""

from __future__ import annotations

import re
import unicodedata
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from graders.integrity.files import size_text

_WORD = re.compile(r"[^\W_]+")  # runs of letters and digits: \w without the underscore
# JSON and string-literal escapes: an item copied into a .jsonl line or a script has "\n" where the
# item breaks a line (a token "n" otherwise) and "\u00e9" where it has "é".
_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|[nrtfbv])")
_UNKNOWN = -1  # the id of a text token no hidden item holds: no n-gram spans it
CHUNK_CHARS = 1 << 20  # huge texts are normalised and scanned in pieces of about this size
MAX_WHERE_PER_ITEM = 3
MAX_SOURCES_LISTED = 8  # what a finding's `where` holds (policy.MAX_FINDING_WHERE)
MAX_LABEL_CHARS = 160  # labels carry agent-chosen file names


def normalise_tokens(text: str) -> list[str]:
    """Escapes undone, NFKC, casefold, then the runs of letters and digits:
    "Q: 3+4\\nA: #### 7" -> q 3 4 a 7."""
    return _WORD.findall(_normalised(text))


def _normalised(text: str) -> str:
    return unicodedata.normalize("NFKC", _ESCAPE.sub(_unescaped, text)).casefold()


def _unescaped(escape: re.Match[str]) -> str:
    code = escape.group(1)
    return chr(int(code, 16)) if code else " "


@dataclass(frozen=True, eq=False)
class HiddenIndex:
    """The hidden items' n-grams, hashed. Tokens become small ids (a text token no item holds
    breaks every window over it, which makes ordinary text cheap to scan) and an n-gram is keyed by
    Python's hash of its id tuple: int hashes are not salted, so keys are stable 64-bit values, and
    a collision can only add a false find, with odds near (n-grams indexed) / 2**64 per window."""

    vocab: dict[str, int]
    table: dict[int, tuple[int, ...]]  # n-gram key -> the items holding it
    item_ngrams: tuple[int, ...]  # distinct n-grams per item; 0 for an unscreened item
    lengths: tuple[int, ...]  # n-gram lengths present, ascending (short items add short ones)

    @classmethod
    def build(
        cls, items: Sequence[str | tuple[str, ...]], *, ngram: int, min_item_tokens: int
    ) -> HiddenIndex:
        """An item is a text, or the texts of its fields: n-grams are then cut within each field (a
        field shorter than `ngram` is one n-gram, matched whole; one shorter than `min_item_tokens`
        is joined with the next), so what a copy puts between the fields (a JSON key, another
        order) breaks none of them."""
        if not 1 <= min_item_tokens <= ngram:
            raise ValueError(f"need 1 <= min_item_tokens ({min_item_tokens}) <= ngram ({ngram})")
        vocab: dict[str, int] = {}
        holders: dict[int, list[int]] = {}
        item_ngrams: list[int] = []
        lengths: set[int] = set()
        for item_index, item in enumerate(items):
            segments = _segments([normalise_tokens(field) for field in _fields(item)], min_item_tokens)
            if sum(map(len, segments)) < min_item_tokens:
                item_ngrams.append(0)
                continue
            keys: set[int] = set()
            for segment in segments:
                ids = tuple(vocab.setdefault(token, len(vocab)) for token in segment)
                size = min(ngram, len(ids))
                lengths.add(size)
                keys.update(hash(ids[start : start + size]) for start in range(len(ids) - size + 1))
            item_ngrams.append(len(keys))
            for key in keys:
                holders.setdefault(key, []).append(item_index)
        table = {key: tuple(indices) for key, indices in holders.items()}
        return cls(vocab, table, tuple(item_ngrams), tuple(sorted(lengths)))

    @property
    def unscreened(self) -> int:
        return self.item_ngrams.count(0)

    def scan(self, text: str) -> dict[int, set[int]]:
        """Item index -> keys of that item's n-grams that occur in `text`."""
        return self.scan_counting(text)[0]

    def scan_counting(self, text: str) -> tuple[dict[int, set[int]], int]:
        """`scan`, and how many tokens `text` holds. In chunks, each starting with the last (longest
        n - 1) tokens of the one before, so no window is lost."""
        found: dict[int, set[int]] = {}
        keep = self.lengths[-1] - 1 if self.lengths else 0
        carry: list[int] = []
        tokens = 0
        for ids in self._id_chunks(text):
            tokens += len(ids)
            sequence = carry + ids
            self._match(sequence, len(carry), found)
            carry = sequence[max(0, len(sequence) - keep) :]
        return found, tokens

    def _id_chunks(self, text: str) -> Iterator[list[int]]:
        start = 0
        while start < len(text):
            end = min(len(text), start + CHUNK_CHARS)
            if end < len(text):
                # Cut after whitespace: no word nor escape is split, nor characters NFKC would compose.
                cut = max(text.rfind(space, start, end) for space in " \n\t\r")
                if cut > start:
                    end = cut + 1
            yield [self.vocab.get(token, _UNKNOWN) for token in _WORD.findall(_normalised(text[start:end]))]
            start = end

    def _match(self, sequence: list[int], seen: int, found: dict[int, set[int]]) -> None:
        """Record the n-grams in `sequence`, skipping windows inside its first `seen` ids (the
        previous chunk's carry, already matched). Windows only run within runs of known tokens."""
        table = self.table
        breaks = [position for position, token in enumerate(sequence) if token == _UNKNOWN]
        start = 0
        for end in (*breaks, len(sequence)):
            run = tuple(sequence[start:end])
            for size in self.lengths:
                for offset in range(max(0, seen - size + 1 - start), len(run) - size + 1):
                    key = hash(run[offset : offset + size])
                    for item in table.get(key, ()):
                        found.setdefault(item, set()).add(key)
            start = end + 1


def _fields(item: str | tuple[str, ...]) -> tuple[str, ...]:
    return (item,) if isinstance(item, str) else item


def _segments(fields: list[list[str]], min_tokens: int) -> list[list[str]]:
    """The fields' tokens, each field a segment of its own; a field shorter than `min_tokens` joined
    with the next (the last one with the one before)."""
    segments: list[list[str]] = []
    run: list[str] = []
    for tokens in fields:
        run = run + tokens
        if len(run) >= min_tokens:
            segments.append(run)
            run = []
    if run and segments:
        segments[-1] = segments[-1] + run
    elif run:
        segments.append(run)
    return segments


@dataclass(frozen=True)
class ItemFinding:
    item: int  # index into the hidden items
    share: float  # of its distinct n-grams, the share found
    where: tuple[str, ...]  # the first MAX_WHERE_PER_ITEM sources it was found in


@dataclass(frozen=True)
class ContaminationReport:
    items_screened: int
    items_unscreened: int
    max_overlap: float
    findings: tuple[ItemFinding, ...]  # the contaminated items, by index
    max_share: float  # the highest share found for any item, contaminated or not
    sources_scanned: int
    sources_contaminated: int  # sources holding n-grams of a contaminated item
    top_sources: tuple[tuple[str, int], ...]  # (where, contaminated items it holds), most first
    bytes_scanned: int
    tokens_scanned: int

    @property
    def contaminated(self) -> tuple[int, ...]:
        return tuple(finding.item for finding in self.findings)

    def where(self) -> list[str]:
        """Sources holding contamination, most contaminated items first (at most MAX_SOURCES_LISTED)."""
        return [where for where, _ in self.top_sources]

    def summary(self) -> str:
        size = f"{size_text(self.bytes_scanned)}, {self.tokens_scanned} tokens"
        scanned = f"{self.sources_scanned} sources ({size})"
        unscreened = f", {self.items_unscreened} too short to screen" if self.items_unscreened else ""
        if not self.findings:
            return f"no hidden item found in {scanned}; {self.items_screened} items screened{unscreened}"
        shown = ", ".join(repr(where[:80]) for where in self.where()[:2])
        return (
            f"{len(self.findings)} of {self.items_screened} hidden items found (more than "
            f"{self.max_overlap:g} of their n-grams) in {self.sources_contaminated} of {scanned}, "
            f"most in {shown}"
        )

    def figures(self) -> dict[str, float | int | str]:
        return {
            "items_screened": self.items_screened,
            "items_unscreened": self.items_unscreened,
            "contaminated": len(self.findings),
            "contaminated_share": round(len(self.findings) / max(1, self.items_screened), 4),
            "max_share": round(self.max_share, 4),
            "sources_scanned": self.sources_scanned,
            "sources_contaminated": self.sources_contaminated,
            "bytes_scanned": self.bytes_scanned,
            "tokens_scanned": self.tokens_scanned,
        }


def screen(
    index: HiddenIndex, sources: Iterable[tuple[str, str]], *, max_overlap: float
) -> ContaminationReport:
    """Scan every (where, text) source against `index`; an item is contaminated when the share of
    its n-grams found in all of them together is above `max_overlap`."""
    if not 0.0 <= max_overlap < 1.0:
        raise ValueError(f"max_overlap must be in [0, 1), not {max_overlap}")
    found: dict[int, set[int]] = {}
    where_by_item: dict[int, list[str]] = {}
    items_by_source: list[tuple[str, array[int]]] = []
    sources_scanned = bytes_scanned = tokens_scanned = 0
    for where, text in sources:
        hits, tokens = index.scan_counting(text)
        sources_scanned += 1
        bytes_scanned += len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        tokens_scanned += tokens
        label = where[:MAX_LABEL_CHARS]
        for item, keys in hits.items():
            found.setdefault(item, set()).update(keys)
            labels = where_by_item.setdefault(item, [])
            if len(labels) < MAX_WHERE_PER_ITEM:
                labels.append(label)
        if hits:
            items_by_source.append((label, array("q", sorted(hits))))

    shares = {item: len(keys) / index.item_ngrams[item] for item, keys in found.items()}
    contaminated = sorted(item for item, share in shares.items() if share > max_overlap)
    flagged = set(contaminated)
    per_source = [(where, sum(1 for item in items if item in flagged)) for where, items in items_by_source]
    per_source = sorted(((where, count) for where, count in per_source if count), key=lambda p: (-p[1], p[0]))
    findings = tuple(
        ItemFinding(item=item, share=shares[item], where=tuple(where_by_item[item])) for item in contaminated
    )
    return ContaminationReport(
        items_screened=len(index.item_ngrams) - index.unscreened,
        items_unscreened=index.unscreened,
        max_overlap=max_overlap,
        findings=findings,
        max_share=max(shares.values(), default=0.0),
        sources_scanned=sources_scanned,
        sources_contaminated=len(per_source),
        top_sources=tuple(per_source[:MAX_SOURCES_LISTED]),
        bytes_scanned=bytes_scanned,
        tokens_scanned=tokens_scanned,
    )
