"""What a damaged SQLite file still holds, read page by page (docs/reliability.md "Torn and damaged files").

    for table, rowid, values in salvaged_rows(path):   # one row at a time: RAM holds a page, not a day
        ...

SQLite's own reading walks each table's b-tree from its root: one lost interior page (a torn tail
takes the newest pages, and the b-tree's upper pages are often among them) and every row under it
is unreachable, though its bytes are intact. This reads the file as the SQLite shell's ``.recover``
does: every page is looked at on its own; a table leaf page gives its rows, each row's overflow chain
is followed where it leads to pages that are there, and a row is lost only when a page it needs is
lost. The write-ahead log's committed frames (checksums intact) take their pages' place first, as
SQLite itself would read them. Pages on the free list are skipped: they hold deleted rows.

Only what the file format promises is used (sqlite.org/fileformat2.html, described in
docs/reliability.md): the 100-byte header, b-tree page headers, varints, record serial types.
"""
from __future__ import annotations

import io
import os
import sqlite3
import struct
from collections.abc import Iterator

TABLE_LEAF = 0x0D
WAL_MAGIC = (0x377F0682, 0x377F0683)  # checksums little- / big-endian


class Pages:
    """Pages of the database file, with the write-ahead log's committed frames over them."""

    def __init__(self, path: str | os.PathLike):
        self.file = open(path, "rb")  # noqa: SIM115 - closed by close()
        header = self.file.read(100)
        if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
            self.file.close()
            raise ValueError("not an SQLite database (its header is gone)")
        size = struct.unpack(">H", header[16:18])[0]
        self.page_size = 65536 if size == 1 else size
        self.usable = self.page_size - header[20]
        self.file_pages = os.fstat(self.file.fileno()).st_size // self.page_size
        self.wal_file, self.wal_frames = None, {}
        self.freelist_head = struct.unpack(">I", header[32:36])[0]
        wal = f"{os.fspath(path)}-wal"
        if os.path.exists(wal):
            self._read_wal(wal)
        self.count = max([self.file_pages, *self.wal_frames.keys()]) if self.wal_frames else self.file_pages

    def _read_wal(self, path: str) -> None:
        wal = open(path, "rb")  # noqa: SIM115 - kept for page reads
        header = wal.read(32)
        if len(header) < 32 or struct.unpack(">I", header[:4])[0] not in WAL_MAGIC:
            wal.close()
            return
        big_endian = struct.unpack(">I", header[:4])[0] & 1
        if struct.unpack(">I", header[8:12])[0] != self.page_size:
            wal.close()
            return
        salts = header[16:24]
        s0, s1 = _wal_checksum(header[:24], big_endian, 0, 0)
        if (s0, s1) != struct.unpack(">II", header[24:32]):
            wal.close()
            return
        committed: dict[int, int] = {}
        pending: dict[int, int] = {}
        offset = 32
        while True:
            frame_header = wal.read(24)
            if len(frame_header) < 24 or frame_header[8:16] != salts:
                break
            data = wal.read(self.page_size)
            if len(data) < self.page_size:
                break
            s0, s1 = _wal_checksum(frame_header[:8], big_endian, s0, s1)
            s0, s1 = _wal_checksum(data, big_endian, s0, s1)
            if (s0, s1) != struct.unpack(">II", frame_header[16:24]):
                break  # a torn frame: it and every frame after it were never committed
            page, commit_size = struct.unpack(">II", frame_header[:8])
            pending[page] = offset + 24
            if commit_size:  # a commit frame: the transaction's frames count from here on
                committed.update(pending)
                pending.clear()
            offset += 24 + self.page_size
        self.wal_file, self.wal_frames = wal, committed

    def read(self, number: int) -> bytes | None:
        """Page ``number`` (from 1), or None when it is not in the file (a torn tail)."""
        if number in self.wal_frames:
            self.wal_file.seek(self.wal_frames[number])
            return self.wal_file.read(self.page_size)
        if not 1 <= number <= self.file_pages:
            return None
        self.file.seek((number - 1) * self.page_size)
        data = self.file.read(self.page_size)
        return data if len(data) == self.page_size else None

    def free_pages(self) -> set[int]:
        """The free list's pages, as far as it can be followed."""
        free, trunk, seen = set(), self.freelist_head, set()
        header = self.read(1)
        if header is not None:
            trunk = struct.unpack(">I", header[32:36])[0]
        while trunk and trunk not in seen:
            seen.add(trunk)
            free.add(trunk)
            data = self.read(trunk)
            if data is None:
                break
            following, count = struct.unpack(">II", data[:8])
            count = min(count, (self.usable - 8) // 4)
            free.update(struct.unpack(f">{count}I", data[8:8 + 4 * count]))
            trunk = following
        return free

    def close(self) -> None:
        self.file.close()
        if self.wal_file is not None:
            self.wal_file.close()


def salvaged_rows(path: str | os.PathLike) -> Iterator[tuple[str, int, list]]:
    """(table, rowid, values) of every row whose pages are all there, table by table as the schema
    names them (rows of a table the schema no longer names are left out). ValueError when the file
    is not SQLite at all."""
    pages = Pages(path)
    try:
        tables = _tables(pages)
        free = pages.free_pages()
        for number in range(1, pages.count + 1):
            if number in free or number == 1:
                continue
            data = pages.read(number)
            if data is None or data[0] != TABLE_LEAF:
                continue
            table = tables.get(number)  # a leaf that is its table's root names its table
            for rowid, values in _leaf_rows(pages, data, 0):
                name = table or _guess_table(values, tables)
                if name:
                    yield name, rowid, values
    finally:
        pages.close()


def _tables(pages: Pages) -> dict:
    """{root page: table name} and {"columns": {table: number of columns}} from the schema (page 1)."""
    first = pages.read(1)
    out: dict = {"columns": {}}
    if first is None or first[100] != TABLE_LEAF:
        return out  # a schema over several pages: tables are told apart by their columns alone
    for _, values in _leaf_rows(pages, first, 100):
        if len(values) >= 5 and values[0] == "table" and isinstance(values[4], str):
            out[int(values[3] or 0)] = values[1]
            out["columns"][values[1]] = _column_count(values[4])
    return out


def _column_count(sql: str) -> int:
    db = sqlite3.connect(":memory:")
    try:
        db.execute(sql)
        return len(db.execute(f"SELECT * FROM ({sql.split('(', 1)[0].split()[-1]}) LIMIT 0").description or ())
    except sqlite3.Error:
        return 0
    finally:
        db.close()


def _guess_table(values: list, tables: dict) -> str | None:
    """A leaf below an interior page: its table by its rows' shape (the archive's tables differ in
    their columns: chunks has many, holes six, meta two)."""
    counts = tables.get("columns", {})
    matching = [name for name, count in counts.items() if count == len(values)]
    if len(matching) == 1:
        return matching[0]
    chunks = counts.get("chunks", 0)
    if chunks and len(values) >= 17 and isinstance(values[1], str) and isinstance(values[2], float):
        return "chunks"  # a row written before a column was added has fewer values
    return None


def _leaf_rows(pages: Pages, data: bytes, start: int) -> Iterator[tuple[int, list]]:
    cells = struct.unpack(">H", data[start + 3:start + 5])[0]
    for i in range(cells):
        at = start + 8 + 2 * i
        if at + 2 > len(data):
            return
        pointer = struct.unpack(">H", data[at:at + 2])[0]
        try:
            payload_size, at = _varint(data, pointer)
            rowid, at = _varint(data, at)
            payload = _payload(pages, data, at, payload_size)
            if payload is None:
                continue  # an overflow page it needs is lost
            yield _signed(rowid), _record(payload)
        except (IndexError, ValueError, struct.error, UnicodeDecodeError):
            continue  # a damaged cell: the rest of the page may still read


def _payload(pages: Pages, data: bytes, at: int, size: int) -> bytes | None:
    usable = pages.usable
    most = usable - 35
    if size <= most:
        return data[at:at + size]
    least = ((usable - 12) * 32 // 255) - 23
    local = least + (size - least) % (usable - 4)
    if local > most:
        local = least
    out = io.BytesIO()
    out.write(data[at:at + local])
    overflow = struct.unpack(">I", data[at + local:at + local + 4])[0]
    seen = set()
    while out.tell() < size:
        if not overflow or overflow in seen:
            return None
        seen.add(overflow)
        page = pages.read(overflow)
        if page is None:
            return None
        overflow = struct.unpack(">I", page[:4])[0]
        out.write(page[4:min(usable, 4 + size - out.tell())])
    return out.getvalue()


def _record(payload: bytes) -> list:
    header_size, at = _varint(payload, 0)
    types = []
    while at < header_size:
        serial, at = _varint(payload, at)
        types.append(serial)
    values, at = [], header_size
    for serial in types:
        if serial == 0:
            values.append(None)
        elif 1 <= serial <= 6:
            width = (1, 2, 3, 4, 6, 8)[serial - 1]
            values.append(int.from_bytes(payload[at:at + width], "big", signed=True))
            at += width
        elif serial == 7:
            values.append(struct.unpack(">d", payload[at:at + 8])[0])
            at += 8
        elif serial in (8, 9):
            values.append(serial - 8)
        elif serial >= 12:
            width = (serial - 12) // 2
            raw = payload[at:at + width]
            if len(raw) < width:
                raise ValueError("a record longer than its payload")
            values.append(raw.decode("utf-8") if serial % 2 else bytes(raw))
            at += width
        else:
            raise ValueError(f"serial type {serial} is reserved")
    return values


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = 0
    for i in range(9):
        byte = data[at + i]
        if i == 8:
            return (value << 8) | byte, at + 9
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, at + i + 1
    raise ValueError("varint")


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _wal_checksum(data: bytes, big_endian: int, s0: int, s1: int) -> tuple[int, int]:
    words = struct.unpack(f"{'>' if big_endian else '<'}{len(data) // 4}I", data)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1
