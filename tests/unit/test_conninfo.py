"""A DSN's secret is taken out for children and shown as *** in what pathprof records, whatever the DSN's form."""
import pytest
from pathprof.agent.postgres.conninfo import redact, split_secret
from pathprof.errors import UserError


@pytest.mark.parametrize("dsn", [
    "host=db port=5433 user=app password=s3cr3t dbname=shop",
    "host=db port=5433 user=app password='s3 cr3t' dbname=shop",
    "postgresql://app:s3cr3t@db:5433/shop",
    "postgresql://app:s3cr3t@db:5433/shop?sslmode=require&sslpassword=k3y",
])
def test_no_form_of_dsn_keeps_its_secret(dsn):
    public, env = split_secret(dsn)
    secret = "s3 cr3t" if "'" in dsn else "s3cr3t"
    assert secret not in public and env["PGPASSWORD"] == secret
    assert "host=db" in public and "port=5433" in public and "user=app" in public and "dbname=shop" in public
    shown = redact(dsn)
    assert secret not in shown and "k3y" not in shown and "password=***" in shown
    if "sslpassword" in dsn:
        assert env["PGSSLPASSWORD"] == "k3y" and "sslmode=require" in public


def test_a_dsn_without_a_secret_keeps_all_it_says():
    public, env = split_secret("host=db user=app passfile=/home/app/.pgpass")
    assert env == {} and sorted(public.split()) == ["host=db", "passfile=/home/app/.pgpass", "user=app"]
    assert sorted(redact("host=db user=app").split()) == ["host=db", "user=app"]


def test_a_malformed_dsn_is_a_user_error():
    with pytest.raises(UserError, match="not a valid connection string"):
        split_secret("host=db password='unterminated")
