//! The step graph: what the Scheduler may start next, in which order, and
//! what lies upstream of a step.
//!
//! Graph algorithms work on step indices (`deps[i]` lists the indices step
//! `i` depends on) so that validation can run them before names are known to
//! be unique; the public methods on [`Workflow`] wrap them with names.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

use rota_model::StepName;

use crate::definition::{StepDef, Workflow};

impl Workflow {
    /// The step called `name`, or the `for_each` step whose instance it
    /// names (`NAME[i]`).
    pub fn step(&self, name: &StepName) -> Option<&StepDef> {
        if let Some((step, _)) = name.instance_of() {
            // An instance of a `for_each` step runs as that step.
            return self.steps.iter().find(|def| def.name == step && def.for_each.is_some());
        }
        self.steps.iter().find(|step| &step.name == name)
    }

    /// Every step, each after all of its dependencies. Among steps whose
    /// dependencies are all placed, the one defined first comes first, so
    /// the order is the same on every run and for sequential workflows it is
    /// the definition order.
    pub fn topological_order(&self) -> Vec<&StepDef> {
        self.order.iter().map(|&index| &self.steps[index]).collect()
    }

    /// The steps the Scheduler may start now: not started, with every
    /// dependency completed, in topological order. Several at once is a
    /// fan-out; a step depending on several waits for all of them (fan-in).
    ///
    /// ```
    /// use std::collections::HashSet;
    /// use rota_model::StepName;
    /// use rota_workflow::{AgentCatalog, StepDef, Workflow};
    ///
    /// let workflow = Workflow::builder("fan", 1)
    ///     .step(StepDef::new("a", "delay"))
    ///     .step(StepDef::new("b", "delay").depends_on(["a"]))
    ///     .step(StepDef::new("c", "delay").depends_on(["a"]))
    ///     .step(StepDef::new("d", "delay").depends_on(["b", "c"]))
    ///     .build(&AgentCatalog::builtin())?;
    /// let done: HashSet<StepName> = ["a", "b"].iter().map(|n| StepName::new(*n).unwrap()).collect();
    /// let started = done.clone();
    /// let ready = workflow.ready(|s| done.contains(s), |s| !started.contains(s));
    /// assert_eq!(ready.iter().map(|s| s.name().as_str()).collect::<Vec<_>>(), ["c"]);
    /// # Ok::<(), rota_workflow::Diagnostics>(())
    /// ```
    pub fn ready(&self, completed: impl Fn(&StepName) -> bool, not_started: impl Fn(&StepName) -> bool) -> Vec<&StepDef> {
        self.order
            .iter()
            .map(|&index| &self.steps[index])
            .filter(|step| not_started(&step.name) && step.depends_on.iter().all(&completed))
            .collect()
    }

    /// Every step that waits for `name` (its dependents, theirs, and so
    /// on), without `name` itself, in definition order. Empty for an
    /// unknown name.
    pub fn downstream(&self, name: &StepName) -> Vec<&StepName> {
        let mut found: BTreeSet<&StepName> = BTreeSet::new();
        // A step's dependencies come before it in topological order, so one
        // pass in that order sees every dependent after what it waits for.
        for step in self.topological_order() {
            if step.depends_on.iter().any(|dep| dep == name || found.contains(dep)) {
                found.insert(&step.name);
            }
        }
        self.steps().iter().map(|step| &step.name).filter(|step| found.contains(step)).collect()
    }

    /// Every step that must complete before `name` can start (its
    /// dependencies, theirs, and so on), without `name` itself. Empty for an
    /// unknown name.
    pub fn upstream(&self, name: &StepName) -> BTreeSet<&StepName> {
        let mut found = BTreeSet::new();
        let mut pending: Vec<&StepName> = self.step(name).map(|step| step.depends_on.iter().collect()).unwrap_or_default();
        while let Some(next) = pending.pop() {
            if found.insert(next)
                && let Some(step) = self.step(next)
            {
                pending.extend(step.depends_on.iter());
            }
        }
        found
    }
}

/// Kahn's algorithm, taking the lowest index among ready steps. Returns the
/// order, or, if there is a cycle, which steps could not be placed.
pub(crate) fn topological(deps: &[Vec<usize>]) -> Result<Vec<usize>, Vec<bool>> {
    let n = deps.len();
    let mut waiting_on: Vec<usize> = deps.iter().map(Vec::len).collect();
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (step, its_deps) in deps.iter().enumerate() {
        for &dep in its_deps {
            dependents[dep].push(step);
        }
    }
    let mut ready: BinaryHeap<Reverse<usize>> = (0..n).filter(|&i| waiting_on[i] == 0).map(Reverse).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(Reverse(step)) = ready.pop() {
        order.push(step);
        for &dependent in &dependents[step] {
            waiting_on[dependent] -= 1;
            if waiting_on[dependent] == 0 {
                ready.push(Reverse(dependent));
            }
        }
    }
    if order.len() == n { Ok(order) } else { Err(waiting_on.iter().map(|&count| count > 0).collect()) }
}

/// One cycle through each group of unplaced steps, each rotated to start at
/// its lowest index and listed so that every step depends on the next (and
/// the last on the first).
///
/// Every unplaced step depends on another unplaced step, so following such
/// dependencies from any of them must come back to a step already on the
/// path: that loop is a cycle. A walk that runs into an earlier walk stops,
/// so steps that merely depend on a cycle are not reported.
pub(crate) fn cycles(deps: &[Vec<usize>], unplaced: &[bool]) -> Vec<Vec<usize>> {
    let n = deps.len();
    let mut seen = vec![false; n];
    let mut found = Vec::new();
    for start in (0..n).filter(|&i| unplaced[i]) {
        let mut path: Vec<usize> = Vec::new();
        let mut on_path: Vec<Option<usize>> = vec![None; n];
        let mut current = start;
        while !seen[current] {
            if let Some(at) = on_path[current] {
                let mut cycle = path[at..].to_vec();
                let lowest = cycle.iter().enumerate().min_by_key(|(_, step)| **step).map(|(i, _)| i).unwrap_or(0);
                cycle.rotate_left(lowest);
                found.push(cycle);
                break;
            }
            on_path[current] = Some(path.len());
            path.push(current);
            current = *deps[current].iter().find(|&&dep| unplaced[dep]).expect("an unplaced step waits on another unplaced step");
        }
        for step in path {
            seen[step] = true;
        }
    }
    found
}

/// The indices of every step `step` transitively depends on.
pub(crate) fn upstream_indices(deps: &[Vec<usize>], step: usize) -> Vec<bool> {
    let mut found = vec![false; deps.len()];
    let mut pending = deps[step].clone();
    while let Some(next) = pending.pop() {
        if !found[next] {
            found[next] = true;
            pending.extend(&deps[next]);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sorts_with_ties_in_definition_order() {
        // 0 <- 2, 1 <- 2 ... written out of order on purpose.
        let deps = vec![vec![], vec![3], vec![0], vec![]];
        assert_eq!(topological(&deps), Ok(vec![0, 2, 3, 1]));
    }

    #[test]
    fn finds_each_cycle_once_and_skips_steps_that_only_depend_on_one() {
        // 0 -> 1 -> 2 -> 1 (cycle 1,2); 3 -> 3 (self); 4 -> 0 (downstream only).
        let deps = vec![vec![1], vec![2], vec![1], vec![3], vec![0]];
        let unplaced = topological(&deps).unwrap_err();
        assert_eq!(unplaced, [true, true, true, true, true]);
        assert_eq!(cycles(&deps, &unplaced), [vec![1, 2], vec![3]]);
    }

    #[test]
    fn upstream_is_transitive() {
        let deps = vec![vec![], vec![0], vec![1], vec![0]];
        assert_eq!(upstream_indices(&deps, 2), [true, true, false, false]);
        assert_eq!(upstream_indices(&deps, 0), [false, false, false, false]);
    }

    /// A random DAG: each step depends on some steps defined before it, and
    /// the steps are then shuffled so that definition order is not already
    /// a topological order.
    fn dag() -> impl Strategy<Value = Vec<Vec<usize>>> {
        (1usize..40)
            .prop_flat_map(|n| {
                let edges = proptest::collection::vec(proptest::collection::vec(any::<prop::sample::Index>(), 0..4), n);
                (edges, Just((0..n).collect::<Vec<usize>>()).prop_shuffle())
            })
            .prop_map(|(edges, permutation)| {
                let n = edges.len();
                let mut deps = vec![Vec::new(); n];
                for (step, picks) in edges.iter().enumerate() {
                    if step == 0 {
                        continue;
                    }
                    let mut chosen: Vec<usize> = picks.iter().map(|pick| pick.index(step)).collect();
                    chosen.sort_unstable();
                    chosen.dedup();
                    deps[permutation[step]] = chosen.into_iter().map(|dep| permutation[dep]).collect();
                }
                deps
            })
    }

    proptest! {
        #[test]
        fn topological_order_respects_every_dependency(deps in dag()) {
            let order = topological(&deps).expect("a DAG has an order");
            let mut position = vec![usize::MAX; deps.len()];
            for (at, &step) in order.iter().enumerate() {
                prop_assert_eq!(position[step], usize::MAX, "step {} placed twice", step);
                position[step] = at;
            }
            for (step, its_deps) in deps.iter().enumerate() {
                for &dep in its_deps {
                    prop_assert!(position[dep] < position[step], "{} runs before its dependency {}", step, dep);
                }
            }
        }

        #[test]
        fn a_back_edge_makes_a_reported_cycle(deps in dag(), pick in any::<prop::sample::Index>()) {
            // Add an edge from some step's dependency back to the step.
            let mut deps = deps;
            let edges: Vec<(usize, usize)> = deps.iter().enumerate().flat_map(|(s, d)| d.iter().map(move |&d| (s, d))).collect();
            if edges.is_empty() {
                return Ok(());
            }
            let (step, dep) = edges[pick.index(edges.len())];
            deps[dep].push(step);
            let unplaced = topological(&deps).unwrap_err();
            let found = cycles(&deps, &unplaced);
            prop_assert!(!found.is_empty());
            for cycle in found {
                for (i, &from) in cycle.iter().enumerate() {
                    let to = cycle[(i + 1) % cycle.len()];
                    prop_assert!(deps[from].contains(&to), "{} does not depend on {}", from, to);
                }
            }
        }
    }
}

#[cfg(test)]
mod workflow_tests {
    use std::collections::BTreeSet;

    use rota_model::StepName;

    use crate::{AgentCatalog, StepDef, Workflow};

    fn name(s: &str) -> StepName {
        StepName::new(s).unwrap()
    }

    /// Builds a workflow of `delay` steps from `(name, Some(deps))`, where
    /// `None` means "follow the previous step".
    fn workflow(steps: &[(&str, Option<&[&str]>)]) -> Workflow {
        let mut builder = Workflow::builder("w", 1);
        for (step, deps) in steps {
            let mut def = StepDef::new(*step, "delay");
            if let Some(deps) = deps {
                def = def.depends_on(deps.iter().copied());
            }
            builder = builder.step(def);
        }
        builder.build(&AgentCatalog::builtin()).unwrap()
    }

    /// The names `ready` returns when `done` have completed and `started`
    /// (a superset of `done`) have been started.
    fn ready<'a>(w: &'a Workflow, done: &[&str], started: &[&str]) -> Vec<&'a str> {
        let done: BTreeSet<StepName> = done.iter().map(|s| name(s)).collect();
        let started: BTreeSet<StepName> =
            started.iter().chain(done.iter().map(StepName::as_str).collect::<Vec<_>>().iter()).map(|s| name(s)).collect();
        w.ready(|s| done.contains(s), |s| !started.contains(s)).iter().map(|s| s.name().as_str()).collect()
    }

    #[test]
    fn sequential_steps_become_ready_one_at_a_time() {
        let w = workflow(&[("a", None), ("b", None), ("c", None)]);
        assert_eq!(ready(&w, &[], &[]), ["a"]);
        assert_eq!(ready(&w, &[], &["a"]), Vec::<&str>::new(), "a running step blocks the next");
        assert_eq!(ready(&w, &["a"], &[]), ["b"]);
        assert_eq!(ready(&w, &["a", "b"], &[]), ["c"]);
        assert_eq!(ready(&w, &["a", "b", "c"], &[]), Vec::<&str>::new());
    }

    #[test]
    fn fan_out_then_fan_in() {
        let w = workflow(&[("a", None), ("b", Some(&["a"])), ("c", Some(&["a"])), ("d", Some(&["a"])), ("join", Some(&["b", "c", "d"]))]);
        assert_eq!(ready(&w, &["a"], &[]), ["b", "c", "d"], "fan-out: all at once");
        assert_eq!(ready(&w, &["a", "b"], &["c", "d"]), Vec::<&str>::new());
        assert_eq!(ready(&w, &["a", "b", "c"], &["d"]), Vec::<&str>::new(), "fan-in waits for every branch");
        assert_eq!(ready(&w, &["a", "b", "c", "d"], &[]), ["join"]);
    }

    #[test]
    fn several_roots_start_together() {
        let w = workflow(&[("a", None), ("b", Some(&[])), ("c", Some(&["a", "b"]))]);
        assert_eq!(ready(&w, &[], &[]), ["a", "b"]);
    }

    #[test]
    fn order_lookup_and_upstream() {
        let w = workflow(&[("late", Some(&["early"])), ("early", Some(&[])), ("mid", Some(&["early"])), ("end", Some(&["late", "mid"]))]);
        let order: Vec<&str> = w.topological_order().iter().map(|s| s.name().as_str()).collect();
        assert_eq!(order, ["early", "late", "mid", "end"]);
        assert_eq!(w.step(&name("mid")).map(|s| s.name().as_str()), Some("mid"));
        assert!(w.step(&name("nope")).is_none());
        let up: Vec<&str> = w.upstream(&name("end")).into_iter().map(StepName::as_str).collect();
        assert_eq!(up, ["early", "late", "mid"]);
        assert!(w.upstream(&name("early")).is_empty());
        assert!(w.upstream(&name("nope")).is_empty());
        let down: Vec<&str> = w.downstream(&name("early")).into_iter().map(StepName::as_str).collect();
        assert_eq!(down, ["late", "mid", "end"], "definition order");
        let down: Vec<&str> = w.downstream(&name("mid")).into_iter().map(StepName::as_str).collect();
        assert_eq!(down, ["end"]);
        assert!(w.downstream(&name("end")).is_empty());
        assert!(w.downstream(&name("nope")).is_empty());
    }
}
