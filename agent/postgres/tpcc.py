"""A TPC-C-like workload driven by pgbench (`--script tpcc`; `--scale` is the number of warehouses).

The five transactions are five pgbench scripts weighted by the standard mix -- New-Order 45, Payment 43,
Order-Status 4, Delivery 4, Stock-Level 4 -- so pgbench's per-script figures (-r) give latency and TPS per
transaction type. The loader builds the nine tables with the specification's cardinalities per warehouse
(10 districts, 30,000 customers, 100,000 stock rows, 30,000 orders with ~300,000 order lines, 9,000 new
orders; 100,000 items in all) with set-based SQL on the server.

How it differs from the TPC-C specification (README "TPC-C"): no keying or think times (every client runs
transactions back to back, so throughput is not tpmC and is not comparable with published results); uniform
random keys instead of NURand; customers chosen by id only (no by-last-name lookups); every order line is
supplied by the home warehouse (no remote orders); New-Order never rolls back on an unused item; Delivery
runs inline as one statement over the ten districts instead of as a queued, deferred job; no response-time
constraints or checks of the consistency conditions. Deadlocks between New-Orders are retried (pgbench
--max-tries), and the retries are counted in pgbench's figures.
"""
from __future__ import annotations

from pathlib import Path

MIX = [("new_order", 45), ("payment", 43), ("order_status", 4), ("delivery", 4), ("stock_level", 4)]
MAX_TRIES = 10

SCHEMA = """
DROP TABLE IF EXISTS warehouse, district, customer, history, item, stock, oorder, new_order, order_line;
CREATE TABLE warehouse (w_id int PRIMARY KEY, w_name text, w_tax numeric(4,4), w_ytd numeric(14,2));
CREATE TABLE district (d_w_id int, d_id int, d_name text, d_tax numeric(4,4), d_ytd numeric(14,2),
                       d_next_o_id int, PRIMARY KEY (d_w_id, d_id));
CREATE TABLE customer (c_w_id int, c_d_id int, c_id int, c_first text, c_last text, c_credit char(2),
                       c_discount numeric(4,4), c_balance numeric(14,2), c_ytd_payment numeric(14,2),
                       c_payment_cnt int, c_delivery_cnt int, c_data text, PRIMARY KEY (c_w_id, c_d_id, c_id));
CREATE TABLE history (h_c_id int, h_c_d_id int, h_c_w_id int, h_d_id int, h_w_id int, h_date timestamp,
                      h_amount numeric(8,2), h_data text);
CREATE TABLE item (i_id int PRIMARY KEY, i_name text, i_price numeric(5,2), i_data text);
CREATE TABLE stock (s_w_id int, s_i_id int, s_quantity int, s_ytd int, s_order_cnt int, s_dist_info text,
                    s_data text, PRIMARY KEY (s_w_id, s_i_id));
CREATE TABLE oorder (o_w_id int, o_d_id int, o_id int, o_c_id int, o_entry_d timestamp, o_carrier_id int,
                     o_ol_cnt int, o_all_local int, PRIMARY KEY (o_w_id, o_d_id, o_id));
CREATE TABLE new_order (no_w_id int, no_d_id int, no_o_id int, PRIMARY KEY (no_w_id, no_d_id, no_o_id));
CREATE TABLE order_line (ol_w_id int, ol_d_id int, ol_o_id int, ol_number int, ol_i_id int, ol_supply_w_id int,
                         ol_delivery_d timestamp, ol_quantity int, ol_amount numeric(8,2), ol_dist_info text,
                         PRIMARY KEY (ol_w_id, ol_d_id, ol_o_id, ol_number));
"""

LOAD = """
INSERT INTO item SELECT i, 'item-' || i, (random() * 99 + 1)::numeric(5,2), md5(i::text)
  FROM generate_series(1, 100000) i;
INSERT INTO warehouse SELECT w, 'w' || w, (random() * 0.2)::numeric(4,4), 300000 FROM generate_series(1, :W) w;
INSERT INTO district SELECT w, d, 'd' || d, (random() * 0.2)::numeric(4,4), 30000, 3001
  FROM generate_series(1, :W) w, generate_series(1, 10) d;
INSERT INTO customer SELECT w, d, c, 'first' || c, 'last' || (c % 1000),
       CASE WHEN random() < 0.1 THEN 'BC' ELSE 'GC' END, (random() * 0.5)::numeric(4,4), -10, 10, 1, 0, md5(c::text)
  FROM generate_series(1, :W) w, generate_series(1, 10) d, generate_series(1, 3000) c;
INSERT INTO stock SELECT w, i, (random() * 90 + 10)::int, 0, 0, md5(i::text), md5(w::text)
  FROM generate_series(1, :W) w, generate_series(1, 100000) i;
INSERT INTO oorder SELECT w, d, o, (random() * 2999)::int + 1, now(),
       CASE WHEN o < 2101 THEN (random() * 9)::int + 1 END, 10, 1
  FROM generate_series(1, :W) w, generate_series(1, 10) d, generate_series(1, 3000) o;
INSERT INTO order_line SELECT w, d, o, n, (random() * 99999)::int + 1, w, CASE WHEN o < 2101 THEN now() END, 5,
       CASE WHEN o < 2101 THEN 0 ELSE (random() * 9999)::numeric / 100 END, md5(n::text)
  FROM generate_series(1, :W) w, generate_series(1, 10) d, generate_series(1, 3000) o, generate_series(1, 10) n;
INSERT INTO new_order SELECT w, d, o FROM generate_series(1, :W) w, generate_series(1, 10) d,
       generate_series(2101, 3000) o;
CREATE INDEX oorder_customer ON oorder (o_w_id, o_d_id, o_c_id, o_id);
VACUUM ANALYZE;
"""

_KEYS = """\\set w_id random(1, :warehouses)
\\set d_id random(1, 10)
\\set c_id random(1, 3000)
"""

SCRIPTS = {
    "new_order": _KEYS + """\\set ol_cnt random(5, 15)
BEGIN;
SELECT c_discount, c_last, c_credit FROM customer WHERE c_w_id = :w_id AND c_d_id = :d_id AND c_id = :c_id;
SELECT w_tax FROM warehouse WHERE w_id = :w_id;
UPDATE district SET d_next_o_id = d_next_o_id + 1 WHERE d_w_id = :w_id AND d_id = :d_id RETURNING d_next_o_id - 1 AS o_id, d_tax \\gset
INSERT INTO oorder (o_w_id, o_d_id, o_id, o_c_id, o_entry_d, o_ol_cnt, o_all_local) VALUES (:w_id, :d_id, :o_id, :c_id, now(), :ol_cnt, 1);
INSERT INTO new_order (no_w_id, no_d_id, no_o_id) VALUES (:w_id, :d_id, :o_id);
WITH lines AS (SELECT n AS ol_number, (random() * 99999)::int + 1 AS i_id, (random() * 9)::int + 1 AS qty FROM generate_series(1, :ol_cnt) n), upd AS (UPDATE stock s SET s_quantity = CASE WHEN s_quantity - l.qty >= 10 THEN s_quantity - l.qty ELSE s_quantity - l.qty + 91 END, s_ytd = s_ytd + l.qty, s_order_cnt = s_order_cnt + 1 FROM lines l WHERE s.s_w_id = :w_id AND s.s_i_id = l.i_id RETURNING s.s_i_id) INSERT INTO order_line (ol_w_id, ol_d_id, ol_o_id, ol_number, ol_i_id, ol_supply_w_id, ol_quantity, ol_amount, ol_dist_info) SELECT :w_id, :d_id, :o_id, l.ol_number, l.i_id, :w_id, l.qty, l.qty * i.i_price, 'dist' FROM lines l JOIN item i ON i.i_id = l.i_id;
END;
""",
    "payment": _KEYS + """\\set amount random(100, 500000)
BEGIN;
UPDATE warehouse SET w_ytd = w_ytd + :amount * 0.01 WHERE w_id = :w_id;
UPDATE district SET d_ytd = d_ytd + :amount * 0.01 WHERE d_w_id = :w_id AND d_id = :d_id;
UPDATE customer SET c_balance = c_balance - :amount * 0.01, c_ytd_payment = c_ytd_payment + :amount * 0.01, c_payment_cnt = c_payment_cnt + 1 WHERE c_w_id = :w_id AND c_d_id = :d_id AND c_id = :c_id;
INSERT INTO history (h_c_id, h_c_d_id, h_c_w_id, h_d_id, h_w_id, h_date, h_amount, h_data) VALUES (:c_id, :d_id, :w_id, :d_id, :w_id, now(), :amount * 0.01, 'payment');
END;
""",
    "order_status": _KEYS + """BEGIN;
SELECT c_balance, c_first, c_last FROM customer WHERE c_w_id = :w_id AND c_d_id = :d_id AND c_id = :c_id;
SELECT ol_i_id, ol_supply_w_id, ol_quantity, ol_amount, ol_delivery_d FROM order_line WHERE ol_w_id = :w_id AND ol_d_id = :d_id AND ol_o_id = (SELECT max(o_id) FROM oorder WHERE o_w_id = :w_id AND o_d_id = :d_id AND o_c_id = :c_id);
END;
""",
    "delivery": """\\set w_id random(1, :warehouses)
\\set carrier random(1, 10)
BEGIN;
WITH oldest AS (SELECT no_d_id, min(no_o_id) AS o_id FROM new_order WHERE no_w_id = :w_id GROUP BY no_d_id), del AS (DELETE FROM new_order n USING oldest m WHERE n.no_w_id = :w_id AND n.no_d_id = m.no_d_id AND n.no_o_id = m.o_id RETURNING n.no_d_id, n.no_o_id), o AS (UPDATE oorder SET o_carrier_id = :carrier FROM del WHERE o_w_id = :w_id AND o_d_id = del.no_d_id AND o_id = del.no_o_id RETURNING o_d_id, o_id, o_c_id), ol AS (UPDATE order_line SET ol_delivery_d = now() FROM del WHERE ol_w_id = :w_id AND ol_d_id = del.no_d_id AND ol_o_id = del.no_o_id RETURNING ol_d_id, ol_o_id, ol_amount) UPDATE customer c SET c_balance = c_balance + s.amount, c_delivery_cnt = c_delivery_cnt + 1 FROM (SELECT o.o_d_id, o.o_c_id, sum(ol.ol_amount) AS amount FROM o JOIN ol ON ol.ol_d_id = o.o_d_id AND ol.ol_o_id = o.o_id GROUP BY o.o_d_id, o.o_c_id) s WHERE c.c_w_id = :w_id AND c.c_d_id = s.o_d_id AND c.c_id = s.o_c_id;
END;
""",
    "stock_level": """\\set w_id random(1, :warehouses)
\\set d_id random(1, 10)
\\set threshold random(10, 20)
SELECT count(DISTINCT s_i_id) FROM order_line JOIN stock ON s_w_id = ol_w_id AND s_i_id = ol_i_id, district WHERE d_w_id = :w_id AND d_id = :d_id AND ol_w_id = :w_id AND ol_d_id = :d_id AND ol_o_id >= d_next_o_id - 20 AND ol_o_id < d_next_o_id AND s_quantity < :threshold;
""",
}


def load_sql(warehouses: int) -> str:
    """The whole loader for psql (-v ON_ERROR_STOP=1): schema, data, index, statistics."""
    return SCHEMA + LOAD.replace(":W", str(int(warehouses)))


def script_args(script_dir: Path, warehouses: int) -> list[str]:
    """pgbench arguments: the five weighted scripts (written into the run directory, kept with it), the
    warehouse count as a variable, and deadlock retries."""
    argv = []
    for name, weight in MIX:
        path = script_dir / f"tpcc_{name}.sql"
        path.write_text(SCRIPTS[name])
        argv += ["-f", f"{path}@{weight}"]
    return argv + ["-D", f"warehouses={int(warehouses)}", f"--max-tries={MAX_TRIES}"]
