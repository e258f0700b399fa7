//! Statement parameters numbered as they are pushed: [`Params::push`] binds
//! a value and hands back the `$n` the statement's text uses for it, so that
//! no parameter number is kept by hand.
//!
//! The text of a statement built this way is the same on every call (its
//! values are pushed in one fixed order), so it is built on first use and
//! kept ([`Statement`]): sqlx's prepared-statement cache and
//! [`Names::sql`](crate::sql::Names::sql) both want one stable text per
//! statement.
//!
//! Deliberately left out: statements of a few parameters bound in one
//! `.bind()` chain beside their text, whose order is plain to see.

use std::fmt;
use std::sync::OnceLock;

use rota_store::Error;
use sqlx::postgres::PgArguments;
use sqlx::{Arguments, Postgres};

use crate::Result;

/// The values of one statement, in the order of their numbers.
#[derive(Default)]
pub(crate) struct Params {
    args: PgArguments,
}

/// A parameter's place in the statement; displays as `$n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Param(usize);

impl fmt::Display for Param {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "${}", self.0)
    }
}

/// An array parameter with the SQL type of the array; displays as
/// `$n::type`, the form `unnest` and `cardinality` take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Array {
    param: Param,
    sql_type: &'static str,
}

impl fmt::Display for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}::{}", self.param, self.sql_type)
    }
}

/// `arrays` as a list for `unnest(…)`: `$1::text[], $2::bigint[], …`.
pub(crate) fn list(arrays: &[Array]) -> String {
    arrays.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

impl Params {
    /// Binds `value` as the next parameter and returns its number.
    pub(crate) fn push<'q, T: sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres>>(&mut self, value: T) -> Result<Param> {
        self.args.add(value).map_err(|e| Error::Backend(format!("encoding a statement parameter: {e}")))?;
        Ok(Param(self.args.len()))
    }

    /// Binds `values`, an array whose SQL type is `sql_type` (`"text[]"`),
    /// as the next parameter.
    pub(crate) fn array<'q, T: sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres>>(
        &mut self,
        values: T,
        sql_type: &'static str,
    ) -> Result<Array> {
        Ok(Array { param: self.push(values)?, sql_type })
    }

    /// The values, for `query_with` and its kin.
    pub(crate) fn into_arguments(self) -> PgArguments {
        self.args
    }
}

/// The text of one statement whose parameters come from [`Params`].
pub(crate) struct Statement(OnceLock<String>);

impl Statement {
    pub(crate) const fn new() -> Statement {
        Statement(OnceLock::new())
    }

    /// The text `write` gives, written on the first call and kept: every
    /// call pushes its parameters in the same order, so their numbers, and
    /// the text, never change. Debug builds write it again on every call and
    /// check that.
    pub(crate) fn text(&'static self, write: impl Fn() -> String) -> &'static str {
        let text = self.0.get_or_init(&write);
        debug_assert_eq!(*text, write(), "a statement's parameters were pushed in another order than on its first use");
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_follow_the_pushes() {
        let mut params = Params::default();
        let first = params.push(7_i64).unwrap();
        let names = params.array(vec!["a", "b"], "text[]").unwrap();
        assert_eq!(format!("{first} {names}"), "$1 $2::text[]");
        let more = [params.array(vec![1_i64], "bigint[]").unwrap(), params.array(vec![true], "bool[]").unwrap()];
        assert_eq!(list(&more), "$3::bigint[], $4::bool[]");
    }

    #[test]
    fn a_statement_is_written_once() {
        static STATEMENT: Statement = Statement::new();
        let first = STATEMENT.text(|| "SELECT $1".to_owned());
        assert!(std::ptr::eq(first, STATEMENT.text(|| "SELECT $1".to_owned())), "the same text, kept");
    }
}
