import pickle

import pytest

from jupyter_mesh import Extent, MeshValueError, Point, Shape, Slice, ValueMesh


def mesh(**sizes):
    return Shape.from_sizes(sizes)


def test_row_major_ranks_and_points():
    s = mesh(hosts=2, gpus=4)
    assert len(s) == 8
    assert s.ranks() == list(range(8))
    p = s.point(6)
    assert dict(p) == {"hosts": 1, "gpus": 2} and p.rank == 6


def test_select_int_drops_dim_and_slice_keeps_it():
    s = mesh(hosts=2, gpus=4)
    a = s.select(gpus=2)
    assert a.labels == ("hosts",) and a.ranks() == [2, 6]
    b = s.select(hosts=1, gpus=slice(1, 4, 2))
    assert b.labels == ("gpus",) and b.ranks() == [5, 7]
    c = s.select(gpus=-1)
    assert c.ranks() == [3, 7]


@pytest.mark.parametrize(
    "kwargs, msg",
    [
        ({"gpus": 4}, "out of range"),
        ({"cpus": 0}, "unknown dim 'cpus'"),
        ({"gpus": slice(3, 1)}, "selects nothing"),
        ({"gpus": "0"}, "takes an int or a slice"),
    ],
)
def test_select_errors_are_clear(kwargs, msg):
    with pytest.raises(MeshValueError, match=msg):
        mesh(hosts=2, gpus=4).select(**kwargs)


def test_errors_are_also_monarchs_builtin_types():
    """A ported ``except IndexError`` / ``TypeError`` / ``KeyError`` catches what Monarch raises there."""
    s = mesh(hosts=2, gpus=2)
    with pytest.raises(IndexError, match="index 5 out of range for dim 'gpus'"):
        s.select(gpus=5)
    with pytest.raises(TypeError, match="unknown dim 'tp'"):
        s.select(tp=0)
    vm = ValueMesh(s, [0, 1, 2, 3])
    with pytest.raises(KeyError) as missing:
        vm.item(hosts=1)
    assert str(missing.value) == "item() needs exactly the dims ['hosts', 'gpus']; missing ['gpus']"
    with pytest.raises(KeyError, match="unknown"):
        vm.item(hosts=0, gpus=0, x=1)
    with pytest.raises(IndexError, match="out of range"):
        vm.item(hosts=0, gpus=2)
    with pytest.raises(KeyError, match="unknown dim 'tp'"):
        vm.size("tp")
    assert isinstance(missing.value, MeshValueError)  # and ours still catch it


def test_extent_and_point_as_monarch_has_them():
    e = Extent(["hosts", "gpus"], [2, 3])
    assert e.nelements == 6 and repr(e) == str(e) == "{hosts: 2, gpus: 3}"
    p = Point(4, e)
    assert p.size("gpus") == 3 and repr(p) == str(p) == "{'hosts': 1/2, 'gpus': 1/3}"
    with pytest.raises(MeshValueError, match="Dimension 'tp' not found"):
        p.size("tp")
    # Monarch's ``Shape(["gpus"], Slice(offset=0, sizes=[2], strides=[1]))`` (lists) builds the same shape
    monarchs = Shape(["hosts", "gpus"], Slice(offset=0, sizes=[2, 3], strides=[3, 1]))
    assert monarchs == mesh(hosts=2, gpus=3) and hash(monarchs) == hash(mesh(hosts=2, gpus=3))
    assert ValueMesh(monarchs, list(range(6))).item(hosts=1, gpus=0) == 3


def test_rename_flatten_split():
    s = mesh(hosts=2, gpus=4)
    assert s.rename(gpus="ranks").labels == ("hosts", "ranks")
    f = s.flatten("all")
    assert f.labels == ("all",) and f.ranks() == list(range(8))
    sp = s.split(gpus=("dp", "tp"), tp=2)
    assert dict(sp.extent) == {"hosts": 2, "dp": 2, "tp": 2}
    assert sp.ranks() == list(range(8))
    assert sp.select(tp=1).ranks() == [1, 3, 5, 7]
    with pytest.raises(MeshValueError, match="not contiguous"):
        s.select(gpus=slice(0, 3)).flatten("x")
    with pytest.raises(MeshValueError, match="does not divide"):
        s.split(gpus=("dp", "tp"), tp=3)
    with pytest.raises(MeshValueError, match="duplicate"):
        s.rename(gpus="hosts")


def test_index_of_matches_ranks_for_views():
    s = mesh(a=3, b=4, c=5)
    views = [
        s,
        s.select(b=slice(1, 4, 2)),
        s.select(a=2),
        s.select(c=slice(0, 5, 3), a=slice(1, 3)),
        s.split(c=("x", "y"), y=1),
    ]
    for v in views:
        ranks = v.ranks()
        for i, r in enumerate(ranks):
            assert v.slice.index_of(r) == i
        for r in set(range(60)) - set(ranks):
            assert v.slice.index_of(r) is None


def test_slice_wire_roundtrip():
    sl = Slice(3, (2, 2), (8, 1))
    assert Slice.from_wire(sl.to_wire()) == sl


def test_value_mesh():
    s = mesh(hosts=1, gpus=3)
    vm = ValueMesh(s, ["a", "b", "c"])
    assert vm.item(hosts=0, gpus=1) == "b"
    assert list(vm.values()) == ["a", "b", "c"]
    assert [dict(p) for p, _ in vm.items()] == [{"hosts": 0, "gpus": i} for i in range(3)]
    assert pickle.loads(pickle.dumps(vm)) == vm
    with pytest.raises(MeshValueError, match="missing"):
        vm.item(gpus=1)
    with pytest.raises(MeshValueError, match="out of range"):
        vm.item(hosts=0, gpus=3)
    with pytest.raises(MeshValueError, match="needs 3 values"):
        ValueMesh(s, [1])


def test_value_mesh_rename_and_split_keep_each_value_in_place():
    vm = ValueMesh(mesh(hosts=2, gpus=2), [0, 1, 2, 3])
    renamed = vm.rename(gpus="g")
    assert dict(renamed.extent) == {"hosts": 2, "g": 2} and renamed.item(hosts=1, g=0) == 2
    split = vm.flatten("r").split(r=("x", "y"), x=2)
    assert dict(split.extent) == {"x": 2, "y": 2} and split.item(x=1, y=1) == 3
    assert list(vm.slice(gpus=1).rename(hosts="h").items())[1][1] == 3
