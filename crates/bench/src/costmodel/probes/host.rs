//! The host side of the calibration probes: each probe timed in a fresh agent process
//! (which runs it with `crate::host::probe`), its mTHP or shmem knob set, and the scatter of
//! its layout sampled.

use super::{Probe, PAGE, PMD, SPAWN_SECS};
use crate::host::HostSession;
use usermm_model::profile::HOST_FAR;

/// The host's median time of `probe`, ns: its mTHP or shmem knob set under `session`, then
/// measured in a fresh agent process; with it, the median share of the layout's folio boundaries far apart in physical memory,
/// per mille, where the probe samples one.
pub fn host_ns(session: &HostSession, probe: &Probe) -> Result<(f64, Option<u64>), String> {
    if let Probe::Spawn { vmas } = *probe {
        session.folio(PAGE)?;
        let cell = crate::host::agent::HostCell::Spawn {
            vmas,
            secs: SPAWN_SECS,
        };
        return crate::host::agent::measure(&cell).map(|(rate, _)| (1e9 / rate.max(1e-9), None));
    }
    if let Probe::File {
        pages,
        folio,
        layout,
        munmap,
    } = *probe
    {
        // One repetition per agent, as the tables' cells.
        session.shmem_folio(folio)?;
        let reps = crate::host::probe::reps_for(pages * PAGE);
        let cell = crate::host::agent::HostCell::ForkOrMunmap {
            size: pages * PAGE,
            folio,
            layout,
            munmap,
        };
        let runs: Vec<(f64, Option<u64>)> = (0..reps)
            .map(|_| {
                crate::host::agent::measure(&cell)
                    .map(|(secs, c)| (secs * 1e9, c.get(HOST_FAR).copied()))
            })
            .collect::<Result<_, _>>()?;
        let ns = usermm_model::prices::median(runs.iter().map(|r| r.0)).ok_or("no time")?;
        let far = usermm_model::prices::median(runs.iter().filter_map(|r| r.1.map(|f| f as f64)));
        return Ok((ns, far.map(|f| f.round() as u64)));
    }
    match probe {
        Probe::TmpfsRead { .. } | Probe::TmpfsSparseRead { .. } => session.shmem_folio(PAGE)?,
        // The munlock table's THP column sets the top-level knob; mTHP sizes their own.
        Probe::Munlock { folio: PMD, .. } => session.thp(true)?,
        _ => session.folio(probe.anon_folio())?,
    }
    crate::host::agent::measure(&crate::host::agent::HostCell::Probe(*probe))
        .map(|(secs, c)| (secs * 1e9, c.get(HOST_FAR).copied()))
}
