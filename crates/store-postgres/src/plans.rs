//! The generic plans of the statements that find their rows by key.
//!
//! Each is prepared as the store prepares it (generic, on a connection with
//! the store's planner settings) on a new schema, whose tables are empty
//! and have never been analyzed, and again once the tables hold 20,000
//! rows and are analyzed: both times it must probe the key for each row it
//! looks for, never walk an index that leads with a column it only checks
//! (see `PLANNER_SETTINGS`).
//!
//! Left out: tables analyzed while empty or nearly so. There, walking the
//! whole key index once looks cheaper than ten probes, and a plan made then
//! does so until the next ANALYZE (autovacuum analyzes a table again as it
//! grows; a server without it keeps the plan).

use std::sync::Arc;

use rota_model::{QueueName, SystemClock};
use rota_store::{Outgoing, Queues};
use sqlx::{Connection, PgConnection};

use crate::sql::Names;

/// A statement and the key probes its plan must make: each an index scan
/// (index and table alias) with its condition on the line after it.
struct Expected {
    name: &'static str,
    sql: String,
    probes: &'static [(&'static str, &'static str)],
}

fn statements() -> Vec<Expected> {
    vec![
        Expected {
            name: "commit",
            sql: crate::commit_sql::commit_sql_of_every_part(),
            probes: &[
                ("tasks_pkey on tasks t", "(id = w.id)"),
                ("steps_pkey on steps s", "((task_id = w_1.task_id) AND (name = w_1.name))"),
                ("messages_pkey on messages m", "(seq = c.seq)"),
                // The key of a message handed over, looked up once per message
                // (`$28` stands for the message's key in the subquery).
                ("messages_ordering on messages k", "((queue_id = q_1.id) AND (ordering_key = $28))"),
            ],
        },
        Expected {
            name: "complete",
            sql: crate::queue_sql::COMPLETE_SQL.to_owned(),
            probes: &[("messages_pkey on messages m", "(seq = t.seq)")],
        },
        Expected {
            name: "leased delivery count",
            sql: crate::queue_sql::LEASED_COUNT_SQL.to_owned(),
            probes: &[("messages_pkey on messages", "(seq = $1)")],
        },
        Expected { name: "renew", sql: crate::queue_sql::RENEW_SQL.to_owned(), probes: &[("messages_pkey on messages", "(seq = $1)")] },
        Expected {
            name: "dead letters' redrive",
            sql: crate::queue_sql::REDRIVE_LISTED_SQL.to_owned(),
            probes: &[("dead_letters_pkey on dead_letters", "(seq = ANY ($3))")],
        },
        Expected { name: "task warning", sql: crate::task_sql::WARN_TASK_SQL.to_owned(), probes: &[("tasks_pkey on tasks", "(id = $1)")] },
    ]
}

/// Whether `plan` scans `index` (`"name on table alias"`), or the index
/// alone, with exactly `condition` as its index condition.
fn probes(plan: &str, index: &str, condition: &str) -> bool {
    let lines: Vec<&str> = plan.lines().collect();
    let scans = |line: &str| ["Index Scan", "Index Only Scan"].iter().any(|scan| line.contains(&format!("{scan} using {index} ")));
    lines.windows(2).any(|pair| scans(pair[0]) && pair[1].trim() == format!("Index Cond: {condition}"))
}

/// The highest `$n` in `sql`: how many parameters it takes.
fn parameter_count(sql: &str) -> usize {
    sql.split('$').skip(1).filter_map(|after| after.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()).max().unwrap_or(0)
}

async fn generic_plan(conn: &mut PgConnection, names: &Names, sql: &str) -> String {
    let prepare = format!("PREPARE planned AS {}", names.qualify(sql));
    sqlx::raw_sql(names.raw(&prepare)).execute(&mut *conn).await.unwrap();
    let nulls = vec!["NULL"; parameter_count(sql)].join(", ");
    let explain = format!("EXPLAIN EXECUTE planned({nulls})");
    let plan: Vec<String> = sqlx::query_scalar(names.raw(&explain)).fetch_all(&mut *conn).await.unwrap();
    sqlx::raw_sql("DEALLOCATE planned").execute(&mut *conn).await.unwrap();
    plan.join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_that_find_rows_by_key_plan_through_the_key_whatever_the_statistics() {
    let Some(schema) = rota_testkit::postgres::TestSchema::new("key lookups' plans on PostgreSQL") else { return };
    let mut config = crate::Config::new(schema.url.clone());
    config.schema = schema.name.clone();
    let store = crate::PgStore::open(config.clone(), Arc::new(SystemClock)).await.unwrap();
    let mut conn = PgConnection::connect_with(&config.connect_options().unwrap()).await.unwrap();
    let names = Names::new(&schema.name);
    let mut wrong = Vec::new();
    for analyzed in [false, true] {
        if analyzed {
            // Tables of 20,000 rows (tasks in flight, their steps, a queue's
            // messages and dead letters), and statistics that say so.
            let queue = QueueName::new("work").unwrap();
            store.send(&queue, Outgoing::json(&serde_json::json!("first")).unwrap()).await.unwrap();
            let fill = names.qualify(
                "INSERT INTO rota.messages (queue_id, id, body, enqueued_at, visible_at)
                 SELECT (SELECT id FROM rota.queues WHERE name = 'work'), 'm-' || g, '{}', g, g FROM generate_series(1, 20000) AS g;
                 INSERT INTO rota.dead_letters (queue_id, id, body, enqueued_at, delivery_count, dead_lettered_at, reason)
                 SELECT (SELECT id FROM rota.queues WHERE name = 'work'), 'd-' || g, '{}', g, 5, g, 'failed' FROM generate_series(1, 20000) AS g;
                 INSERT INTO rota.tasks (id, workflow, workflow_version, input, state, locked_by, lease_epoch, complete_by, not_before,
                                         failure_count, created_at, updated_at)
                 SELECT 't-' || g, 'w', 1, '{}', 'processing', 'scheduler', 1, 1000000, 0, 0, g, g FROM generate_series(1, 20000) AS g;
                 INSERT INTO rota.steps (task_id, name, position, state, attempt, not_before, updated_at)
                 SELECT 't-' || g, 's', 0, 'running', 1, 0, g FROM generate_series(1, 20000) AS g;
                 ANALYZE rota.tasks, rota.steps, rota.messages, rota.events, rota.message_ids, rota.dead_letters;",
            );
            sqlx::raw_sql(names.raw(&fill)).execute(&mut conn).await.unwrap();
        }
        for expected in statements() {
            let plan = generic_plan(&mut conn, &names, &expected.sql).await;
            for (index, condition) in expected.probes.iter().filter(|(index, condition)| !probes(&plan, index, condition)) {
                wrong.push(format!("{} (analyzed: {analyzed}) does not probe {index} by {condition}:\n{plan}", expected.name));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

#[test]
fn parameters_are_counted_by_their_highest_number() {
    assert_eq!(parameter_count("SELECT $1, $12::bigint[], $3"), 12);
    assert_eq!(parameter_count("SELECT 1"), 0);
}
