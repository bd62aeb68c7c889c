"""vidql's own statements run on a connection of their own: a result the user leaves open
on db.con does not block the next vidql statement."""
from __future__ import annotations

import vidql


def test_an_open_user_result_does_not_block_vidql(traffic_db):
    with vidql.connect(traffic_db, progress=False) as db:
        reader = db.con.sql("SELECT * FROM range(1000000)").to_arrow_reader()  # left unread
        assert db.sql("SELECT sum(objects('car')) AS cars FROM t WHERE frame < 50").report.oracle_calls == 50
        approx = db.sql("SELECT AVG(objects('car')) FROM t ERROR WITHIN 0.5 SEED 1")
        assert approx.report.oracle_calls > 0
        assert db.sql("SHOW VIDEOS").df()["name"].tolist() == ["t"]
        assert db.sql("SELECT count(*) FROM t").fetchall() == [(300,)]
        assert db.labels("t").detections([1, 2]).shape[0] > 0
        db.sql("CREATE ORACLE other FROM LABELS '" + str(db.oracles()["source"][0]) + "'")
        assert reader.read_all().num_rows == 1000000  # the user's result is still theirs
        assert db.con.sql("SELECT count(*) FROM vidql.labelled").fetchall()[0][0] >= 50


def test_in_memory_database_shares_one_store(small_traffic):
    video, labels = small_traffic
    with vidql.connect(progress=False) as db:
        db.sql(f"LOAD VIDEO '{video}' AS t; CREATE ORACLE truth FROM LABELS '{labels}'")
        db.sql("SELECT objects('car') FROM t WHERE frame < 5")
        assert db.con.sql("SELECT count(*) FROM t").fetchall() == [(300,)]
        assert db.con.sql("SELECT count(*) FROM vidql.labelled").fetchall() == [(5,)]
