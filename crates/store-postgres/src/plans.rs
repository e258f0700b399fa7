//! The generic plans of the statements that find their rows by key.
//!
//! Each is prepared as the store prepares it (generic, on a connection with
//! the store's planner settings) on a new schema, whose tables are empty
//! and have never been analyzed, and again once a queue holds 20,000
//! messages and the tables are analyzed: both times it must reach its rows
//! through the key, never through an index that leads with a column it only
//! checks (see `PLANNER_SETTINGS`).

use std::sync::Arc;

use rota_model::{QueueName, SystemClock};
use rota_store::{Outgoing, Queues};
use sqlx::{Connection, PgConnection};

use crate::sql::Names;

/// A statement, the index scans its plan must have and the indexes it
/// must not touch.
struct Expected {
    name: &'static str,
    sql: String,
    through: &'static [&'static str],
    never: &'static [&'static str],
}

fn statements() -> Vec<Expected> {
    vec![
        Expected {
            name: "commit",
            sql: crate::commit_sql::commit_sql_of_every_part(),
            through: &["Index Scan using tasks_pkey on tasks t", "Index Scan using messages_pkey on messages m"],
            never: &["tasks_state", "messages_visible"],
        },
        Expected {
            name: "complete",
            sql: crate::queue_sql::COMPLETE_SQL.to_owned(),
            through: &["Index Scan using messages_pkey on messages m"],
            never: &["messages_visible"],
        },
        Expected {
            name: "leased delivery count",
            sql: crate::queue_sql::LEASED_COUNT_SQL.to_owned(),
            through: &["Index Scan using messages_pkey on messages"],
            never: &["messages_visible"],
        },
        Expected {
            name: "renew",
            sql: crate::queue_sql::RENEW_SQL.to_owned(),
            through: &["Index Scan using messages_pkey on messages"],
            never: &["messages_visible"],
        },
        Expected {
            name: "task warning",
            sql: crate::task_sql::WARN_TASK_SQL.to_owned(),
            through: &["Index Scan using tasks_pkey on tasks"],
            never: &["tasks_warn_due", "tasks_leased", "tasks_locked_by", "tasks_state"],
        },
    ]
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
            // A queue of 20,000 messages, and statistics that say so.
            let queue = QueueName::new("work").unwrap();
            store.send(&queue, Outgoing::json(&serde_json::json!("first")).unwrap()).await.unwrap();
            let fill = names.qualify(
                "INSERT INTO rota.messages (queue_id, id, body, enqueued_at, visible_at)
                 SELECT (SELECT id FROM rota.queues WHERE name = 'work'), 'm-' || g, '{}', g, g FROM generate_series(1, 20000) AS g",
            );
            sqlx::raw_sql(names.raw(&fill)).execute(&mut conn).await.unwrap();
            let analyze = names.qualify("ANALYZE rota.tasks, rota.steps, rota.messages, rota.events, rota.message_ids");
            sqlx::raw_sql(names.raw(&analyze)).execute(&mut conn).await.unwrap();
        }
        for expected in statements() {
            let plan = generic_plan(&mut conn, &names, &expected.sql).await;
            for through in expected.through.iter().filter(|through| !plan.contains(*through)) {
                wrong.push(format!("{} (analyzed: {analyzed}) has no {through:?}:\n{plan}", expected.name));
            }
            for index in expected.never.iter().filter(|index| plan.contains(*index)) {
                wrong.push(format!("{} (analyzed: {analyzed}) walks {index}:\n{plan}", expected.name));
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
