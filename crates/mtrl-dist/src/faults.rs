//! Rank faults for the failure tests: `MTRL_RANK_FAULT=kill:1@2` makes rank 1 kill itself
//! (SIGKILL) when it reaches step 2, `hang:1@2` makes it stop answering (it sleeps), `slow:1@2`
//! makes it late but healthy (it sleeps [`SLOW_S`] seconds, then goes on), and `diverge:1@2`
//! makes it perturb one parameter (which the cross-rank checksum must catch).

use crate::error::{DistError, Result};

/// The variable read by [`RankFault::from_env`].
pub const RANK_FAULT_VAR: &str = "MTRL_RANK_FAULT";
/// How late a `slow` rank is, in seconds.
pub const SLOW_S: u64 = 8;

/// What the faulty rank does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    Kill,
    Hang,
    Slow,
    Diverge,
}

/// One injected rank fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankFault {
    pub action: FaultAction,
    pub rank: usize,
    /// The step the rank is about to run (1-based) when it acts.
    pub step: u64,
}

impl RankFault {
    /// The fault `MTRL_RANK_FAULT` asks for, if any.
    pub fn from_env() -> Result<Option<RankFault>> {
        match std::env::var(RANK_FAULT_VAR) {
            Ok(s) if !s.trim().is_empty() => Self::parse(&s).map(Some),
            _ => Ok(None),
        }
    }

    /// `kill|hang|slow|diverge:<rank>@<step>`.
    pub fn parse(spec: &str) -> Result<RankFault> {
        let bad = |m: &str| DistError::Fault {
            var: RANK_FAULT_VAR,
            spec: spec.to_string(),
            message: m.to_string(),
        };
        let (action, rest) = spec
            .trim()
            .split_once(':')
            .ok_or_else(|| bad("expected `kill|hang|slow|diverge:<rank>@<step>`"))?;
        let action = match action {
            "kill" => FaultAction::Kill,
            "hang" => FaultAction::Hang,
            "slow" => FaultAction::Slow,
            "diverge" => FaultAction::Diverge,
            _ => return Err(bad("the action is one of kill, hang, slow, diverge")),
        };
        let (rank, step) = rest
            .split_once('@')
            .ok_or_else(|| bad("expected `<rank>@<step>` after the action"))?;
        let rank = rank.parse().map_err(|_| bad("the rank is not a number"))?;
        let step = step.parse().map_err(|_| bad("the step is not a number"))?;
        Ok(RankFault { action, rank, step })
    }

    /// Whether `rank` acts before running `step`.
    pub fn hits(&self, rank: usize, step: u64) -> bool {
        self.rank == rank && self.step == step
    }

    /// Kills, hangs or delays this process (a `Diverge` is the caller's to apply).
    pub fn act(&self) {
        match self.action {
            FaultAction::Kill => {
                eprintln!("{RANK_FAULT_VAR}: rank {} kills itself", self.rank);
                let pid = std::process::id().to_string();
                let _ = std::process::Command::new("kill")
                    .args(["-9", &pid])
                    .status();
                std::process::abort();
            }
            FaultAction::Hang => {
                eprintln!("{RANK_FAULT_VAR}: rank {} stops answering", self.rank);
                loop {
                    std::thread::sleep(std::time::Duration::from_secs(3600));
                }
            }
            FaultAction::Slow => {
                eprintln!("{RANK_FAULT_VAR}: rank {} is {SLOW_S} s late", self.rank);
                std::thread::sleep(std::time::Duration::from_secs(SLOW_S));
            }
            FaultAction::Diverge => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_errors_name_the_variable() {
        let f = RankFault::parse("hang:1@3").unwrap();
        assert_eq!((f.action, f.rank, f.step), (FaultAction::Hang, 1, 3));
        assert!(f.hits(1, 3) && !f.hits(0, 3) && !f.hits(1, 2));
        assert_eq!(
            RankFault::parse("slow:0@1").unwrap().action,
            FaultAction::Slow
        );
        for bad in ["boom:1@2", "kill:1", "kill:x@2", "kill"] {
            let e = RankFault::parse(bad).unwrap_err().to_string();
            assert!(e.contains(RANK_FAULT_VAR) && e.contains(bad), "{e}");
        }
    }
}
