//! The XID catalog, embedded: code, mnemonic, description, category, NVIDIA's immediate
//! action and whether the node should be drained. Transcribed from NVIDIA's Xid Catalog
//! (Ampere and newer) with the drain column from NVSentinel's `xiderrorsmapping.csv`, where
//! the two agree; see `../shared/reference/xid-kmsg.md` §1.2 for the sources of each row.

use super::health::Action;

/// Who is likely at fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    /// The application (restart it; the GPU is fine).
    Application,
    /// The GPU, its memory or its links.
    Hardware,
    /// The driver, firmware or GSP.
    Driver,
    /// A consequence of another error, or a notice.
    Informational,
    /// Not in the catalog.
    Unknown,
}

impl Category {
    /// The `gpu.xid.category` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Application => "application",
            Category::Hardware => "hardware",
            Category::Driver => "driver",
            Category::Informational => "informational",
            Category::Unknown => "unknown",
        }
    }
}

/// One catalog row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The XID.
    pub code: u32,
    /// NVIDIA's mnemonic.
    pub mnemonic: &'static str,
    /// What it means.
    pub description: &'static str,
    /// Who is likely at fault.
    pub category: Category,
    /// NVIDIA's immediate action (resolution bucket).
    pub action: &'static str,
    /// Drain the node (fatal for the GPU).
    pub drain: bool,
}

macro_rules! catalog {
    ($( $code:literal, $mn:literal, $desc:literal, $cat:ident, $action:literal, $drain:literal; )*) => {
        /// Every catalogued XID, by code.
        pub const CATALOG: &[Entry] = &[ $( Entry { code: $code, mnemonic: $mn, description: $desc, category: Category::$cat, action: $action, drain: $drain }, )* ];
    };
}

catalog! {
    13, "ROBUST_CHANNEL_GR_EXCEPTION", "Graphics engine exception", Application, "RESTART_APP", false;
    31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault", Application, "RESTART_APP", false;
    32, "ROBUST_CHANNEL_PBDMA_ERROR", "Invalid or corrupted push buffer stream", Application, "RESTART_APP", false;
    43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing", Application, "IGNORE", false;
    45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "Preemptive cleanup, due to previous errors", Informational, "IGNORE", false;
    46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "GPU stopped processing", Hardware, "RESET_GPU", true;
    48, "ROBUST_CHANNEL_GPU_ECC_DBE", "Double bit ECC error", Hardware, "WORKFLOW_XID_48", true;
    61, "PMU_BREAKPOINT", "Internal micro-controller breakpoint/warning", Hardware, "CONTACT_SUPPORT", true;
    62, "PMU_HALT_ERROR", "Internal micro-controller halt", Hardware, "RESET_GPU", true;
    63, "INFOROM_DRAM_RETIREMENT_EVENT", "GPU memory remapping or page retirement event", Informational, "IGNORE", false;
    64, "INFOROM_DRAM_RETIREMENT_FAILURE", "GPU memory remapping or page retirement failure", Hardware, "RESET_GPU", true;
    68, "ROBUST_CHANNEL_NVDEC0_ERROR", "NVDEC0 exception", Application, "RESTART_APP", false;
    69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "Graphics engine class error", Application, "RESTART_APP", false;
    74, "NVLINK_ERROR", "NVLink error", Hardware, "WORKFLOW_NVLINK_ERR", true;
    79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", Hardware, "RESTART_BM", true;
    92, "EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", Hardware, "IGNORE", false;
    94, "ROBUST_CHANNEL_CONTAINED_ERROR", "Contained memory error", Hardware, "RESTART_APP", false;
    95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "Uncontained memory error", Hardware, "RESET_GPU", true;
    109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "Context switch timeout", Driver, "RESET_GPU", true;
    119, "GSP_RPC_TIMEOUT", "GSP RPC timeout", Driver, "RESET_GPU", true;
    120, "GSP_ERROR", "GSP error", Driver, "RESET_GPU", true;
    121, "C2C_ERROR", "C2C link error (corrected)", Hardware, "IGNORE", false;
    140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "ECC unrecovered error", Hardware, "RESET_GPU", true;
    143, "GPU_INIT_ERROR", "GPU initialization error", Hardware, "RESET_GPU", true;
    144, "NVLINK_SAW_ERROR", "NVLink SAW error", Hardware, "WORKFLOW_NVLINK5_ERR", true;
    145, "NVLINK_RLW_ERROR", "NVLink RLW error", Hardware, "WORKFLOW_NVLINK5_ERR", true;
    146, "NVLINK_TLW_ERROR", "NVLink TLW error", Hardware, "WORKFLOW_NVLINK5_ERR", true;
    147, "NVLINK_TREX_ERROR", "NVLink TREX error", Hardware, "WORKFLOW_NVLINK5_ERR", true;
    148, "NVLINK_NVLPW_CTRL_ERROR", "NVLink NVLPW_CTRL error", Hardware, "WORKFLOW_NVLINK5_ERR", true;
    149, "NVLINK_NETIR_ERROR", "NVLink NETIR error", Hardware, "WORKFLOW_NVLINK5_ERR", true;
    150, "NVLINK_MSE_ERROR", "NVLink MSE error", Hardware, "WORKFLOW_NVLINK5_ERR", true;
    154, "GPU_RECOVERY_ACTION_CHANGED", "GPU recovery action changed", Informational, "XID_154", false;
    155, "NVLINK_SW_DEFINED_ERROR", "NVLink software-defined error", Driver, "RESET_GPU", true;
    156, "RESOURCE_RETIREMENT_EVENT", "Resource retirement event", Hardware, "RESET_GPU", true;
    157, "RESOURCE_RETIREMENT_FAILURE", "Resource retirement failure", Hardware, "IGNORE", false;
    158, "GPU_FATAL_TIMEOUT", "GPU fatal timeout", Hardware, "RESET_GPU", true;
}

/// Whether the catalog has `code` (the XIDs counted by code; the rest count as `other`).
pub fn is_catalogued(code: u32) -> bool {
    CATALOG.iter().any(|e| e.code == code)
}

/// The catalog row of `code`, or an `unknown` row (contact support) for codes not in it.
pub fn lookup(code: u32) -> Entry {
    CATALOG
        .iter()
        .copied()
        .find(|e| e.code == code)
        .unwrap_or(Entry {
            code,
            mnemonic: "UNKNOWN",
            description: "XID not in Junction's catalog",
            category: Category::Unknown,
            action: "CONTACT_SUPPORT",
            drain: false,
        })
}

/// The health action (`gpu.health.action`) for a catalog action.
pub fn health_action(action: &str) -> Action {
    match action {
        "RESTART_APP" => Action::RestartApp,
        "RESET_GPU" | "WORKFLOW_XID_48" => Action::ResetGpu,
        "RESTART_BM" | "RESTART_VM" => Action::RebootNode,
        "IGNORE" | "XID_154" => Action::None,
        _ => Action::DrainAndService,
    }
}

/// `nvmlDeviceGpuRecoveryAction_t` names (Xid 154 carries the value).
pub fn recovery_action(value: u32) -> &'static str {
    match value {
        0 => "none",
        1 => "gpu_reset",
        2 => "node_reboot",
        3 => "drain_p2p",
        4 => "drain_and_reset",
        5 => "recover_imex_domain",
        6 => "bus_reset",
        7 => "system_reboot",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_codes_are_unique_and_sorted() {
        let codes: Vec<u32> = CATALOG.iter().map(|e| e.code).collect();
        let mut sorted = codes.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(codes, sorted);
    }

    #[test]
    fn the_k8s_device_plugin_application_list_does_not_drain() {
        // NVIDIA k8s-device-plugin internal/rm/health.go ignores 13, 31, 43, 45, 68, 109 as
        // application errors; Junction does not drain on them either, except 109, which
        // NVSentinel marks fatal (the sources disagree; the reference keeps NVSentinel's).
        for code in [13, 31, 43, 45, 68] {
            assert!(!lookup(code).drain, "{code}");
        }
        for code in [48, 64, 74, 79, 95, 119, 120] {
            assert!(lookup(code).drain, "{code}");
        }
        assert_eq!(lookup(999).category, Category::Unknown);
    }
}
