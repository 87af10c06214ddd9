"""HPACK (RFC 7541), the header compression of HTTP/2: a decoder for the header blocks a client
sends, and the few encoding helpers the server's responses need. Pure: bytes in, header lists out.

Decoding keeps the connection's dynamic table (§2.3.2) across header blocks, newest entry first
(index 62), after the static table's 61 entries in one list. An entry's size is len(name) +
len(value) + 32 octets (§4.1); the table evicts its oldest entries to stay within its size limit
(§4.4), which the peer may lower, or raise up to our SETTINGS_HEADER_TABLE_SIZE, with a dynamic
table size update (§6.3).

Names and values are octets; they come out as `str` decoded as latin-1, which maps each octet to
one character, never fails and round-trips (gRPC metadata is ASCII anyway).

Encoding never touches a dynamic table: the server sends indexed static fields and literals without
indexing, so the peer's decoder state for our responses never changes and we keep none.

Any malformed block raises HpackError, the peer's fault: the connection must be closed with
COMPRESSION_ERROR (RFC 9113 §4.3), since the dynamic table is then in an unknown state.
"""

from __future__ import annotations

__all__ = ["Decoder", "HpackError", "encode_indexed_name", "encode_integer", "encode_literal"]


class HpackError(Exception):
    """A header block that is not valid HPACK, or one that exceeds a limit we set."""


# The static table (RFC 7541 Appendix A); index 0 is not a valid index.
_STATIC_TABLE: tuple[tuple[str, str], ...] = (
    ("", ""),
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
)
_STATIC_LENGTH = len(_STATIC_TABLE)  # 62: dynamic indices start here
_ENTRY_OVERHEAD = 32  # octets added to len(name) + len(value) for an entry's size (§4.1)

# An integer (§5.1) takes at most this many octets after its prefix: 7 bits each, so values below
# 2**35, far above any index, string length or table size a peer may send.
_MAX_INTEGER_CONTINUATIONS = 5


class Decoder:
    """Decodes the header blocks of one connection's direction, in the order they were sent.

    `max_table_size` is the SETTINGS_HEADER_TABLE_SIZE we advertise: the dynamic table starts at
    that size and a size update may not exceed it. `max_header_list_size` bounds a decoded header
    list, counted as RFC 9113 §6.5.2 does (len(name) + len(value) + 32 per field).

    After an HpackError the dynamic table is in an unknown state: decode nothing more.
    """

    __slots__ = ("_entries", "_table_size", "_table_limit", "_max_table_size", "_max_header_list_size")

    def __init__(self, max_table_size: int = 4096, max_header_list_size: int = 65536) -> None:
        # ((name, value), size) by index: the static table, then the dynamic table, newest first,
        # so one subscript serves both (§2.3.3). Index 0 is invalid, its entry never read.
        self._entries: list[tuple[tuple[str, str], int]] = [
            (field, len(field[0]) + len(field[1]) + _ENTRY_OVERHEAD) for field in _STATIC_TABLE
        ]
        self._table_size = 0  # the dynamic table's size: the sum of its entries' sizes
        self._table_limit = max_table_size  # its current maximum, which size updates change
        self._max_table_size = max_table_size
        self._max_header_list_size = max_header_list_size

    @property
    def table_size(self) -> int:
        """The dynamic table's size in octets (§4.1)."""
        return self._table_size

    @property
    def dynamic_table(self) -> list[tuple[str, str]]:
        """The dynamic table's entries, newest (index 62) first."""
        return [field for field, _ in self._entries[_STATIC_LENGTH:]]

    def decode(self, block: bytes) -> list[tuple[str, str]]:
        """The header list of one complete header block (HEADERS plus any CONTINUATION fragments)."""
        headers: list[tuple[str, str]] = []
        append = headers.append
        entries = self._entries
        list_size = 0
        pos = 0
        end = len(block)
        while pos < end:
            first = block[pos]
            pos += 1
            if 0x80 < first < 0xFF:  # the common case: an indexed header field (§6.1), index 1-126
                try:
                    field, size = entries[first - 0x80]
                except IndexError:
                    raise HpackError(self._bad_index(first - 0x80)) from None
            elif first & 0x80:  # indexed, index 0 or one continued past the first octet
                index = first & 0x7F
                if index == 0x7F:
                    index, pos = _decode_integer(block, pos, index)
                if not 0 < index < len(entries):
                    raise HpackError(self._bad_index(index))
                field, size = entries[index]
            elif first & 0x40:  # literal with incremental indexing (§6.2.1)
                index = first & 0x3F
                if index == 0x3F:
                    index, pos = _decode_integer(block, pos, index)
                field, size, pos = self._literal(block, pos, end, index)
                self._add(field, size)
            elif first & 0x20:  # dynamic table size update (§6.3)
                if headers:
                    raise HpackError("dynamic table size update after a header field (RFC 7541 §4.2)")
                limit = first & 0x1F
                if limit == 0x1F:
                    limit, pos = _decode_integer(block, pos, limit)
                if limit > self._max_table_size:
                    raise HpackError(f"dynamic table size update to {limit}, above the {self._max_table_size} allowed")
                self._table_limit = limit
                self._evict(limit)
                continue
            else:  # literal without indexing (0000, §6.2.2) or never indexed (0001, §6.2.3)
                index = first & 0x0F
                if index == 0x0F:
                    index, pos = _decode_integer(block, pos, index)
                field, size, pos = self._literal(block, pos, end, index)
            list_size += size
            append(field)
        # Checked once at the end: until then the list holds at most one field per octet of the
        # block, and its strings are no longer than the block's.
        if list_size > self._max_header_list_size:
            raise HpackError(f"header list of {list_size} octets, above the {self._max_header_list_size} allowed")
        return headers

    def _literal(self, block: bytes, pos: int, end: int, index: int) -> tuple[tuple[str, str], int, int]:
        """A literal field's name (entry `index`'s, or the string at `pos` when it is 0) and
        value: the field, its size and the position after it."""
        if index:
            entries = self._entries
            if index >= len(entries):
                raise HpackError(self._bad_index(index))
            name = entries[index][0][0]
        else:
            name, pos = _decode_string(block, pos, end)
        value, pos = _decode_string(block, pos, end)
        return (name, value), len(name) + len(value) + _ENTRY_OVERHEAD, pos

    def _bad_index(self, index: int) -> str:
        return (
            f"index {index} outside the table ({_STATIC_LENGTH - 1} static and"
            f" {len(self._entries) - _STATIC_LENGTH} dynamic entries)"
        )

    def _add(self, field: tuple[str, str], size: int) -> None:
        """Inserts an entry, evicting the oldest ones to make room (§4.4)."""
        if size > self._table_limit:  # larger than the whole table: empties it, is not added
            self._evict(0)
            return
        self._evict(self._table_limit - size)
        self._entries.insert(_STATIC_LENGTH, (field, size))
        self._table_size += size

    def _evict(self, limit: int) -> None:
        """Drops the oldest entries until the dynamic table's size is at most `limit`."""
        entries = self._entries
        table_size = self._table_size
        while table_size > limit:
            table_size -= entries.pop()[1]
        self._table_size = table_size


def _decode_integer(block: bytes, pos: int, value: int) -> tuple[int, int]:
    """The rest of an integer (§5.1) whose prefix was all ones (`value`): (integer, new position)."""
    shift = 0
    end = len(block)
    for _ in range(_MAX_INTEGER_CONTINUATIONS):
        if pos >= end:
            raise HpackError("header block truncated inside an integer")
        byte = block[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise HpackError(f"integer longer than {_MAX_INTEGER_CONTINUATIONS} octets after its prefix")


def _decode_string(block: bytes, pos: int, end: int) -> tuple[str, int]:
    """A string literal (§5.2) at `pos`: (string, new position)."""
    if pos >= end:
        raise HpackError("header block truncated before a string literal")
    first = block[pos]
    pos += 1
    length = first & 0x7F
    if length == 0x7F:
        length, pos = _decode_integer(block, pos, length)
    stop = pos + length
    if stop > end:
        raise HpackError(f"header block truncated inside a string literal of {length} octets")
    if first & 0x80:
        return _huffman_decode(block[pos:stop]), stop
    return str(block[pos:stop], "latin-1"), stop


# Huffman code (RFC 7541 Appendix B): the code length in bits of each symbol, octets 0-255 then EOS
# (256). The code is canonical: sorted by (length, symbol), each code is the previous one plus one,
# shifted left by the growth in length, so the lengths alone define it.
_HUFFMAN_CODE_LENGTHS = bytes(
    (
        13,
        23,
        28,
        28,
        28,
        28,
        28,
        28,
        28,
        24,
        30,
        28,
        28,
        30,
        28,
        28,  # 0x00
        28,
        28,
        28,
        28,
        28,
        28,
        30,
        28,
        28,
        28,
        28,
        28,
        28,
        28,
        28,
        28,  # 0x10
        6,
        10,
        10,
        12,
        13,
        6,
        8,
        11,
        10,
        10,
        8,
        11,
        8,
        6,
        6,
        6,  # 0x20 ' '
        5,
        5,
        5,
        6,
        6,
        6,
        6,
        6,
        6,
        6,
        7,
        8,
        15,
        6,
        12,
        10,  # 0x30 '0'
        13,
        6,
        7,
        7,
        7,
        7,
        7,
        7,
        7,
        7,
        7,
        7,
        7,
        7,
        7,
        7,  # 0x40 '@'
        7,
        7,
        7,
        7,
        7,
        7,
        7,
        7,
        8,
        7,
        8,
        13,
        19,
        13,
        14,
        6,  # 0x50 'P'
        15,
        5,
        6,
        5,
        6,
        5,
        6,
        6,
        6,
        5,
        7,
        7,
        6,
        6,
        6,
        5,  # 0x60 '`'
        6,
        7,
        6,
        5,
        5,
        6,
        7,
        7,
        7,
        7,
        7,
        15,
        11,
        14,
        13,
        28,  # 0x70 'p'
        20,
        22,
        20,
        20,
        22,
        22,
        22,
        23,
        22,
        23,
        23,
        23,
        23,
        23,
        24,
        23,  # 0x80
        24,
        24,
        22,
        23,
        24,
        23,
        23,
        23,
        23,
        21,
        22,
        23,
        22,
        23,
        23,
        24,  # 0x90
        22,
        21,
        20,
        22,
        22,
        23,
        23,
        21,
        23,
        22,
        22,
        24,
        21,
        22,
        23,
        23,  # 0xa0
        21,
        21,
        22,
        21,
        23,
        22,
        23,
        23,
        20,
        22,
        22,
        22,
        23,
        22,
        22,
        23,  # 0xb0
        26,
        26,
        20,
        19,
        22,
        23,
        22,
        25,
        26,
        26,
        26,
        27,
        27,
        26,
        24,
        25,  # 0xc0
        19,
        21,
        26,
        27,
        27,
        26,
        27,
        24,
        21,
        21,
        26,
        26,
        28,
        27,
        27,
        27,  # 0xd0
        20,
        24,
        20,
        21,
        22,
        21,
        21,
        23,
        22,
        22,
        25,
        25,
        24,
        24,
        26,
        23,  # 0xe0
        26,
        27,
        26,
        26,
        27,
        27,
        27,
        27,
        27,
        28,
        27,
        27,
        27,
        27,
        27,
        26,  # 0xf0
        30,  # EOS
    )
)
_EOS = 256

# The byte-at-a-time decoding machine, built on first use. Its states are the internal nodes of the
# code tree (0 is the root, where each symbol starts) plus one failed state, entered on decoding
# EOS, which never leaves. A state is kept pre-multiplied by 256 so that state + input octet indexes
# `_huffman_transitions`, whose entry is (next state * 256, the symbols completed, as a str): 257 x
# 256 entries, about 5 MB, which measured faster than two lists of half the size.
_huffman_transitions: list[tuple[int, str]] = []
_huffman_accepting: frozenset[int] = frozenset()  # states, times 256, where the string may end
_huffman_failed = 0  # the failed state, times 256


def _huffman_codes() -> list[int]:
    """Each symbol's code, as an integer of its code length's bits."""
    lengths = _HUFFMAN_CODE_LENGTHS
    codes = [0] * len(lengths)
    code = -1
    previous_length = 0
    for symbol in sorted(range(len(lengths)), key=lambda symbol: (lengths[symbol], symbol)):
        code = (code + 1) << (lengths[symbol] - previous_length)
        previous_length = lengths[symbol]
        codes[symbol] = code
    return codes


def _build_huffman_machine() -> None:
    global _huffman_transitions, _huffman_accepting, _huffman_failed
    # The code tree: children[node] = [child for bit 0, child for bit 1], a child being an internal
    # node's number or ~symbol for a leaf.
    children: list[list[int]] = [[0, 0]]
    for symbol, code in enumerate(_huffman_codes()):
        node = 0
        for shift in range(_HUFFMAN_CODE_LENGTHS[symbol] - 1, 0, -1):
            bit = (code >> shift) & 1
            if not children[node][bit]:
                children.append([0, 0])
                children[node][bit] = len(children) - 1
            node = children[node][bit]
        children[node][code & 1] = ~symbol
    failed = len(children)
    bases = [state * 256 for state in range(failed + 1)]  # one int object per state
    shared: dict[str, str] = {}  # one object per distinct string of symbols
    transitions: list[tuple[int, str]] = []
    for state in range(len(children)):
        for octet in range(256):
            node = state
            emitted = []
            for shift in range(7, -1, -1):
                child = children[node][(octet >> shift) & 1]
                if child >= 0:
                    node = child
                elif ~child == _EOS:  # EOS inside a string is an error (§5.2)
                    node = failed
                    break
                else:
                    emitted.append(chr(~child))
                    node = 0
            symbols = "".join(emitted)
            transitions.append((bases[node], shared.setdefault(symbols, symbols)))
    transitions.extend([(bases[failed], "")] * 256)
    # The string may end at a symbol's end (the root) or within padding (§5.2): at most 7 bits,
    # the most significant bits of EOS, which are all ones, so the nodes 1 to 7 bits down the
    # all-ones path.
    accepting = [0]
    node = 0
    for _ in range(7):
        node = children[node][1]
        accepting.append(bases[node])
    # Assigned last: a thread that sees the transitions sees the rest (two threads may both build).
    _huffman_failed = bases[failed]
    _huffman_accepting = frozenset(accepting)
    _huffman_transitions = transitions


def _huffman_decode(data: bytes) -> str:
    """The octets a Huffman-coded string (§5.2) stands for, as latin-1 characters."""
    transitions = _huffman_transitions
    if not transitions:
        _build_huffman_machine()
        transitions = _huffman_transitions
    state = 0
    decoded = ""
    for octet in data:
        state, symbols = transitions[state + octet]
        decoded += symbols
    if state not in _huffman_accepting:
        if state == _huffman_failed:
            raise HpackError("EOS symbol inside a Huffman-coded string")
        raise HpackError("Huffman-coded string padded with more than 7 bits or with bits that are not EOS's")
    return decoded


# Encoding: static-table indices, literal names and literal values, never Huffman nor the dynamic
# table.


def encode_integer(value: int, prefix_bits: int, first_byte_flags: int = 0) -> bytes:
    """`value` as an integer with a `prefix_bits`-bit prefix (§5.1), the first octet's other bits
    set from `first_byte_flags` (e.g. 0x80 and a 7-bit prefix for an indexed header field)."""
    if value < 0 or not 1 <= prefix_bits <= 8:
        raise ValueError(f"cannot encode {value} with a {prefix_bits}-bit prefix")
    prefix_max = (1 << prefix_bits) - 1
    if value < prefix_max:
        return bytes((first_byte_flags | value,))
    encoded = bytearray((first_byte_flags | prefix_max,))
    value -= prefix_max
    while value >= 0x80:
        encoded.append(0x80 | (value & 0x7F))
        value >>= 7
    encoded.append(value)
    return bytes(encoded)


def _encode_string(octets: bytes) -> bytes:
    return encode_integer(len(octets), 7) + octets


def encode_literal(name: bytes, value: bytes) -> bytes:
    """A literal header field without indexing, with a literal name (§6.2.2), no Huffman."""
    return b"\x00" + _encode_string(name) + _encode_string(value)


def encode_indexed_name(index: int, value: bytes) -> bytes:
    """A literal header field without indexing, its name the static table's entry `index` (§6.2.2)."""
    if not 0 < index < _STATIC_LENGTH:
        raise ValueError(f"{index} is not a static table index")
    return encode_integer(index, 4) + _encode_string(value)
