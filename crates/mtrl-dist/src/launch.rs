//! Who started this process: the launcher's environment (Open MPI's `mpirun`, Slurm's `srun`,
//! MPICH/PMI) gives the rank, the world size and the rank within the node.

/// What the launcher said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub rank: usize,
    pub world: usize,
    pub local_rank: usize,
    /// The variables it came from (for messages).
    pub source: &'static str,
}

fn var(name: &str) -> Option<usize> {
    std::env::var(name).ok()?.trim().parse().ok()
}

impl Launch {
    /// The launcher's view, or `None` for a process started by hand.
    pub fn from_env() -> Option<Launch> {
        Self::from_lookup(var)
    }

    /// [`Launch::from_env`] over any lookup (tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<usize>) -> Option<Launch> {
        let sets: [(&str, &str, &str, &'static str); 3] = [
            (
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
                "Open MPI's OMPI_COMM_WORLD_*",
            ),
            (
                "PMIX_RANK",
                "SLURM_NTASKS",
                "SLURM_LOCALID",
                "PMIx and Slurm (srun --mpi=pmix)",
            ),
            ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "PMI (MPICH)"),
        ];
        for (r, w, l, source) in sets {
            if let (Some(rank), Some(world)) = (get(r), get(w)) {
                return Some(Launch {
                    rank,
                    world,
                    local_rank: get(l).unwrap_or(0),
                    source,
                });
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn launchers_are_recognised() {
        let env = |pairs: &[(&str, usize)]| {
            let m: HashMap<String, usize> =
                pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
            Launch::from_lookup(move |k| m.get(k).copied())
        };
        assert_eq!(env(&[]), None);
        let l = env(&[
            ("OMPI_COMM_WORLD_RANK", 3),
            ("OMPI_COMM_WORLD_SIZE", 8),
            ("OMPI_COMM_WORLD_LOCAL_RANK", 1),
        ])
        .unwrap();
        assert_eq!((l.rank, l.world, l.local_rank), (3, 8, 1));
        let l = env(&[("PMIX_RANK", 2), ("SLURM_NTASKS", 4), ("SLURM_LOCALID", 0)]).unwrap();
        assert_eq!((l.rank, l.world), (2, 4));
        assert!(env(&[("PMI_RANK", 0)]).is_none());
    }
}
