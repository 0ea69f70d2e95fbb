from cluster.jobmanager.resourcemanager.slot_manager import SlotManager, TaskManagerRegistration


def _tm(sm, tm_id, slots, now=0.0):
    sm.register(TaskManagerRegistration(tm_id, f"tcp://127.0.0.1:{len(sm.task_managers)}", slots, 1, now, now))


def test_requests_fill_one_taskmanager_first_by_default():
    sm = SlotManager()
    _tm(sm, "b", 2)
    _tm(sm, "a", 2)
    sm.request("job1", 2)
    (granted,) = sm.allocate_pending()
    assert [a.task_manager_id for a in granted] == ["b", "b"]  # the first registered
    sm.request("job2", 1)
    (second,) = sm.allocate_pending()
    assert [a.task_manager_id for a in second] == ["a"]
    sm.free("job1")
    sm.request("job3", 2)
    (third,) = sm.allocate_pending()
    assert [a.task_manager_id for a in third] == ["a", "b"]  # the fuller one first, then the next


def test_of_taskmanagers_with_as_many_free_slots_the_one_whose_spark_is_furthest_along_gives_them():
    sm = SlotManager()
    for tm_id in "abcd":
        _tm(sm, tm_id, 2)
    # a's JVM waits for b's start to end, c and d never started one (lazy), until c's failed
    for tm_id, phase in (("a", "queued"), ("b", "starting"), ("c", ""), ("d", "")):
        assert sm.heartbeat(tm_id, 1.0, [], phase)
    sm.request("first", 2)
    (granted,) = sm.allocate_pending()
    assert [a.task_manager_id for a in granted] == ["b", "b"]
    sm.heartbeat("c", 2.0, [], "failed")
    sm.request("second", 1)  # a: queued beats d's none, which beats c's failed start
    sm.request("third", 2)
    assert [[a.task_manager_id for a in g] for g in sm.allocate_pending()] == [["a"], ["a", "d"]]
    # fullest first still comes before Spark: a job's tasks share one TaskManager's session
    sm.free("first")
    sm.heartbeat("c", 3.0, [], "ready")
    sm.request("fourth", 1)
    (fourth,) = sm.allocate_pending()
    assert [a.task_manager_id for a in fourth] == ["d"]


def test_spread_out_slots_break_ties_by_spark_too():
    sm = SlotManager(spread_out=True)
    for tm_id, phase in (("a", ""), ("b", "ready"), ("c", "starting")):
        _tm(sm, tm_id, 2)
        sm.heartbeat(tm_id, 1.0, [], phase)
    sm.request("job", 4)
    (granted,) = sm.allocate_pending()
    assert [a.task_manager_id for a in granted] == ["b", "c", "a", "b"]


def test_requests_are_all_or_nothing_and_spread_evenly():
    sm = SlotManager(spread_out=True)
    _tm(sm, "a", 2)
    _tm(sm, "b", 2)
    sm.request("job1", 2)
    (granted,) = sm.allocate_pending()
    assert sorted(a.task_manager_id for a in granted) == ["a", "b"]
    sm.request("job2", 3)
    assert sm.allocate_pending() == [] and sm.pending() == {"job2": 3}
    assert sm.free_slots == 2 and sm.total_slots == 4


def test_a_smaller_later_request_is_not_blocked_by_a_larger_one():
    sm = SlotManager()
    _tm(sm, "a", 2)
    sm.request("big", 3)
    sm.request("small", 1)
    (granted,) = sm.allocate_pending()
    assert granted[0].job_id == "small" and sm.pending() == {"big": 3}


def test_free_returns_slots_and_serves_waiting_requests():
    sm = SlotManager()
    _tm(sm, "a", 2)
    sm.request("j1", 2)
    sm.allocate_pending()
    sm.request("j2", 1)
    assert sm.allocate_pending() == []
    assert len(sm.free("j1")) == 2 and sm.free_slots == 2
    (granted,) = sm.allocate_pending()
    assert granted[0].job_id == "j2"


def test_lost_task_manager_takes_its_slots_and_reports_allocations():
    sm = SlotManager(spread_out=True)
    _tm(sm, "a", 2)
    _tm(sm, "b", 2)
    sm.request("j", 2)
    sm.allocate_pending()
    assert sm.heartbeat("a", 10.0, []) and not sm.heartbeat("zzz", 10.0, [])
    assert sm.expired(11.0, 5.0) == ["b"]
    lost = sm.unregister("b")
    assert [a.job_id for a in lost] == ["j"] and sm.total_slots == 2
    assert sm.unregister("b") == []


def test_re_registration_keeps_allocations():
    sm = SlotManager()
    _tm(sm, "a", 1)
    sm.request("j", 1)
    sm.allocate_pending()
    assert sm.register(TaskManagerRegistration("a", "tcp://x", 1, 1, 5.0, 5.0)) is False
    assert sm.free_slots == 0 and len(sm.allocations_of("j")) == 1
