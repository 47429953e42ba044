"""The MMIDIDX reader and writer against the byte layout written out by hand from the spec."""

import os
import pickle
import struct

import numpy as np
import pytest

from data import DataError
from data.indexed import (
    DTYPE_CODES,
    IndexedDataset,
    IndexedDatasetWriter,
    best_dtype,
    data_file_path,
    index_file_path,
)

# Megatron's dtype codes, restated here so a renumbering in the module cannot go unnoticed.
SPEC_CODES = {1: "u1", 2: "i1", 3: "i2", 4: "i4", 5: "i8", 6: "f8", 7: "f4", 8: "u2"}


def spec_files(documents, code):
    """(.idx bytes, .bin bytes) for ``documents`` (lists of sequences), written straight from the spec."""
    dtype = np.dtype("<" + SPEC_CODES[code])
    lengths, pointers, document_indices, data = [], [], [0], b""
    for document in documents:
        for sequence in document:
            pointers.append(len(data))
            lengths.append(len(sequence))
            data += np.asarray(sequence, dtype=dtype).tobytes()
        document_indices.append(len(lengths))
    index = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code)
    index += struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(document_indices))
    index += struct.pack(f"<{len(lengths)}i", *lengths)
    index += struct.pack(f"<{len(pointers)}q", *pointers)
    index += struct.pack(f"<{len(document_indices)}q", *document_indices)
    return index, data


def write_spec_files(prefix, documents, code):
    index, data = spec_files(documents, code)
    with open(prefix + ".idx", "wb") as f:
        f.write(index)
    with open(prefix + ".bin", "wb") as f:
        f.write(data)


DOCUMENTS = [[[5, 6, 7]], [[8], [9, 10], []], [[]], [[11, 12, 13, 14]]]


def test_dtype_codes_and_helpers():
    assert DTYPE_CODES == {code: np.dtype(spec) for code, spec in SPEC_CODES.items()}
    assert best_dtype(50257) == np.uint16
    assert best_dtype(65499) == np.uint16
    assert best_dtype(65500) == np.int32
    assert data_file_path("a/b") == "a/b.bin" and index_file_path("a/b") == "a/b.idx"


@pytest.mark.parametrize("code", [4, 8])
def test_reader_reads_hand_built_files(tmp_path, code):
    prefix = str(tmp_path / "hand")
    write_spec_files(prefix, DOCUMENTS, code)
    ds = IndexedDataset(prefix)
    assert ds.dtype == np.dtype(SPEC_CODES[code])
    assert len(ds) == 6 and ds.num_documents == 4 and ds.num_tokens == 10
    assert ds.sequence_lengths.tolist() == [3, 1, 2, 0, 0, 4]
    itemsize = ds.dtype.itemsize
    assert ds.sequence_pointers.tolist() == [0, 3 * itemsize, 4 * itemsize, 6 * itemsize, 6 * itemsize, 6 * itemsize]
    assert ds.document_indices.tolist() == [0, 1, 4, 5, 6]
    assert [ds[i].tolist() for i in range(len(ds))] == [[5, 6, 7], [8], [9, 10], [], [], [11, 12, 13, 14]]
    assert ds.get(5, offset=1, length=2).tolist() == [12, 13]
    assert ds.get(0, offset=2).tolist() == [7]
    assert ds.document_lengths.tolist() == [3, 3, 0, 4]
    assert ds.get_document(1).tolist() == [8, 9, 10]
    assert ds.get_document(1, offset=1, length=2).tolist() == [9, 10]


@pytest.mark.smoke
def test_writer_bytes_follow_spec_field_by_field(tmp_path):
    prefix = str(tmp_path / "written")
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        writer.add_document([5, 6, 7])
        writer.add_sequence([8])
        writer.add_sequence(np.array([9, 10]))
        writer.add_sequence([])
        writer.end_document()
        writer.add_document([])
        writer.add_document([11, 12, 13, 14])
    index = open(prefix + ".idx", "rb").read()
    assert index[:9] == b"MMIDIDX\x00\x00"
    assert struct.unpack_from("<Q", index, 9) == (1,)
    assert struct.unpack_from("<B", index, 17) == (8,)
    assert struct.unpack_from("<QQ", index, 18) == (6, 5)
    assert struct.unpack_from("<6i", index, 34) == (3, 1, 2, 0, 0, 4)
    assert struct.unpack_from("<6q", index, 34 + 24) == (0, 6, 8, 12, 12, 12)
    assert struct.unpack_from("<5q", index, 34 + 24 + 48) == (0, 1, 4, 5, 6)
    assert len(index) == 34 + 24 + 48 + 40
    assert open(prefix + ".bin", "rb").read() == struct.pack("<10H", 5, 6, 7, 8, 9, 10, 11, 12, 13, 14)
    # And the whole files equal an independent rendering of the spec.
    assert (index, open(prefix + ".bin", "rb").read()) == spec_files(DOCUMENTS, 8)


@pytest.mark.parametrize("dtype,high", [(np.uint8, 256), (np.uint16, 65500), (np.int32, 2**31 - 1), (np.int64, 2**40)])
def test_round_trip_random_documents(tmp_path, dtype, high):
    rng = np.random.default_rng(0)
    documents = [rng.integers(0, high, size=rng.integers(0, 40)) for _ in range(200)]
    prefix = str(tmp_path / "random")
    with IndexedDatasetWriter(prefix, dtype) as writer:
        for document in documents:
            writer.add_document(document)
    ds = IndexedDataset(prefix)
    assert ds.dtype == np.dtype(dtype) and len(ds) == len(documents) == ds.num_documents
    assert ds.num_tokens == sum(len(d) for d in documents)
    for i, document in enumerate(documents):
        np.testing.assert_array_equal(ds[i], document)
        np.testing.assert_array_equal(ds.get_document(i), document)
        if len(document) > 3:
            np.testing.assert_array_equal(ds.get(i, 1, 2), document[1:3])


def test_empty_dataset_round_trips(tmp_path):
    prefix = str(tmp_path / "empty")
    IndexedDatasetWriter(prefix, np.uint16).finalize()
    ds = IndexedDataset(prefix)
    assert len(ds) == 0 and ds.num_documents == 0 and ds.num_tokens == 0
    assert os.path.getsize(prefix + ".bin") == 0


def test_multi_sequence_documents(tmp_path):
    prefix = str(tmp_path / "multi")
    with IndexedDatasetWriter(prefix, np.int32) as writer:
        writer.add_sequence([1, 2])
        writer.add_sequence([3])
        writer.end_document()
        writer.add_sequence([4, 5, 6])
        # left open on purpose: finalize closes the last document
    ds = IndexedDataset(prefix)
    assert ds.document_indices.tolist() == [0, 2, 3]
    assert ds.document_lengths.tolist() == [3, 3]
    assert ds.get_document(0).tolist() == [1, 2, 3]
    assert ds.get_document(0, offset=1, length=2).tolist() == [2, 3]  # crosses a sequence boundary
    assert ds.get_document(1).tolist() == [4, 5, 6]


def test_merge_equals_writing_everything_at_once(tmp_path):
    rng = np.random.default_rng(1)
    documents = [[rng.integers(0, 1000, size=rng.integers(0, 9)) for _ in range(rng.integers(1, 4))] for _ in range(30)]
    shards = [documents[:10], documents[10:11], documents[11:]]
    for k, shard in enumerate(shards):
        write_spec_files(str(tmp_path / f"shard{k}"), shard, 8)
    with IndexedDatasetWriter(str(tmp_path / "merged"), np.uint16) as writer:
        for k in range(len(shards)):
            writer.merge(str(tmp_path / f"shard{k}"))
    merged_idx = open(tmp_path / "merged.idx", "rb").read()
    merged_bin = open(tmp_path / "merged.bin", "rb").read()
    assert (merged_idx, merged_bin) == spec_files(documents, 8)


def test_merge_rejects_other_dtype_and_open_document(tmp_path):
    write_spec_files(str(tmp_path / "ints"), DOCUMENTS, 4)
    with IndexedDatasetWriter(str(tmp_path / "out"), np.uint16) as writer:
        with pytest.raises(DataError, match="ints.idx"):
            writer.merge(str(tmp_path / "ints"))
        writer.add_sequence([1])
        with pytest.raises(ValueError, match="end_document"):
            writer.merge(str(tmp_path / "ints"))


def test_failed_write_leaves_nothing_that_looks_valid(tmp_path):
    prefix = str(tmp_path / "crash")
    with pytest.raises(RuntimeError):
        with IndexedDatasetWriter(prefix, np.uint16) as writer:
            writer.add_document([1, 2, 3])
            assert not os.path.exists(prefix + ".idx") and not os.path.exists(prefix + ".bin")
            raise RuntimeError("worker died")
    assert os.listdir(tmp_path) == []


def test_tokens_outside_dtype_are_rejected(tmp_path):
    with IndexedDatasetWriter(str(tmp_path / "narrow"), np.uint16) as writer:
        with pytest.raises(DataError, match="uint16"):
            writer.add_document([1, 70000])
        with pytest.raises(DataError):
            writer.add_document([-1])


def test_out_of_range_reads_raise_index_error(tmp_path):
    prefix = str(tmp_path / "hand")
    write_spec_files(prefix, DOCUMENTS, 8)
    ds = IndexedDataset(prefix)
    with pytest.raises(IndexError):
        ds[6]
    with pytest.raises(IndexError):
        ds.get(0, offset=2, length=2)
    with pytest.raises(IndexError):
        ds.get_document(4)


def _corrupt(prefix, corruption):
    index = bytearray(open(prefix + ".idx", "rb").read())
    data = bytearray(open(prefix + ".bin", "rb").read())
    if corruption == "missing idx":
        os.remove(prefix + ".idx")
        return ".idx"
    if corruption == "missing bin":
        os.remove(prefix + ".bin")
        return ".bin"
    if corruption == "bad magic":
        index[:9] = b"MMIDIDY\x00\x00"
    elif corruption == "version":
        index[9:17] = struct.pack("<Q", 2)
    elif corruption == "dtype code":
        index[17] = 9
    elif corruption == "truncated idx":
        del index[-4:]
    elif corruption == "idx with trailing bytes":
        index += b"\x00" * 8
    elif corruption == "short header":
        del index[20:]
    elif corruption == "short bin":
        del data[-2:]
    elif corruption == "long bin":
        data += b"\x00\x00"
    elif corruption == "bad pointer":
        struct.pack_into("<q", index, 34 + 6 * 4 + 2 * 8, 7)  # sequence 2 should start at byte 8
    elif corruption == "bad document index":
        struct.pack_into("<q", index, 34 + 6 * 12 + 4 * 8, 5)  # last entry must be the sequence count
    else:
        raise AssertionError(corruption)
    open(prefix + ".idx", "wb").write(bytes(index))
    open(prefix + ".bin", "wb").write(bytes(data))
    return ".bin" if "bin" in corruption else ".idx"


@pytest.mark.parametrize(
    "corruption",
    [
        "missing idx",
        "missing bin",
        "bad magic",
        "version",
        "dtype code",
        "truncated idx",
        "idx with trailing bytes",
        "short header",
        "short bin",
        "long bin",
        "bad pointer",
        "bad document index",
    ],
)
def test_corruption_raises_data_error_naming_the_file(tmp_path, corruption):
    prefix = str(tmp_path / "victim")
    write_spec_files(prefix, DOCUMENTS, 8)
    IndexedDataset(prefix)  # intact files open fine
    suffix = _corrupt(prefix, corruption)
    with pytest.raises(DataError) as error:
        IndexedDataset(prefix)
    assert str(error.value).startswith(prefix + suffix)


def test_a_missing_prefix_names_the_dataset_preprocess_wrote_beside_it(tmp_path):
    """Issue 94 item 6f: `--data-path my_data/my` after `--output-prefix my_data/my` (which wrote
    my_data/my_text_document.bin/.idx) said only "file not found"."""
    write_spec_files(str(tmp_path / "my_text_document"), DOCUMENTS, 8)
    (tmp_path / "my_code_document.idx").write_bytes(b"")  # no .bin beside it: not a dataset, not named
    with pytest.raises(DataError) as error:
        IndexedDataset(str(tmp_path / "my"))
    assert str(error.value).endswith(f"; did you mean the prefix '{tmp_path / 'my_text_document'}'? "
                                     "(.bin and .idx exist there)")
    with pytest.raises(DataError, match="did you mean the prefix '.*my_text_document'"):
        IndexedDataset(str(tmp_path / "my_text_document.bin"))  # typed with its extension
    with pytest.raises(DataError) as error:
        IndexedDataset(str(tmp_path / "other"))
    assert "did you mean" not in str(error.value)


def test_pickle_ships_the_prefix_not_the_tokens(tmp_path):
    prefix = str(tmp_path / "big")
    with IndexedDatasetWriter(prefix, np.int32) as writer:
        writer.add_document(np.arange(100_000))
    payload = pickle.dumps(IndexedDataset(prefix))
    assert len(payload) < 1000  # the .bin alone is 400 kB
    np.testing.assert_array_equal(pickle.loads(payload).get(0, 99_990), np.arange(99_990, 100_000))
