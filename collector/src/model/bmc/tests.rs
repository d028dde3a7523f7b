use super::*;

#[test]
fn units_and_types() {
    assert_eq!(
        normalise(Some("Heat"), Some("kW"), None),
        Some((Quantity::Heat, 1000.0))
    );
    assert_eq!(
        normalise(None, Some("Cel"), None),
        Some((Quantity::Temperature, 1.0))
    );
    assert_eq!(
        normalise(Some("Rotational"), Some("RPM"), Some("Pump")),
        Some((Quantity::PumpRpm, 1.0))
    );
    assert_eq!(
        normalise(Some("PressurePa"), Some("Pa"), None),
        Some((Quantity::Pressure, 0.001))
    );
    assert_eq!(
        normalise(Some("LiquidFlow"), Some("L/s"), None),
        Some((Quantity::Flow, 60.0))
    );
    assert_eq!(normalise(None, None, None), None);
    assert_eq!(
        normalise(None, Some("furlongs"), None),
        Some((Quantity::Other, 1.0))
    );
    // What real BMCs send: discrete flags without units, units that contradict the type.
    assert_eq!(normalise(Some("Power"), Some(""), None), None);
    assert_eq!(
        normalise(Some("Current"), Some("Watts"), None),
        Some((Quantity::Power, 1.0))
    );
    assert_eq!(
        normalise(Some("AirFlow"), Some("RPM"), Some("Fan")),
        Some((Quantity::FanRpm, 1.0))
    );
    assert_eq!(
        normalise(Some("AirFlow"), Some("CFM"), None),
        Some((Quantity::Other, 1.0))
    );
    assert_eq!(
        normalise(Some("Altitude"), Some("Pa"), None),
        Some((Quantity::Other, 1.0))
    );
    assert_eq!(
        normalise(Some("Temperature"), Some("C"), None),
        Some((Quantity::Temperature, 1.0))
    );
}

#[test]
fn levels_from_thresholds_or_health() {
    let t = [
        ("upper_caution", 80.0),
        ("upper_critical", 90.0),
        ("lower_critical", 5.0),
    ];
    assert_eq!(Reading::level(50.0, &t, None), Some(Level::Ok));
    assert_eq!(Reading::level(85.0, &t, None), Some(Level::Warning));
    assert_eq!(
        Reading::level(95.0, &t, Some(Level::Ok)),
        Some(Level::Critical)
    );
    assert_eq!(Reading::level(1.0, &t, None), Some(Level::Critical));
    assert_eq!(
        Reading::level(1.0, &[], Some(Level::Warning)),
        Some(Level::Warning)
    );
    assert_eq!(Reading::level(1.0, &[], None), None);
}

fn reading(id: &str, hw_type: &str, quantity: Quantity, value: f64) -> Reading {
    Reading {
        id: id.into(),
        hw_type: hw_type.into(),
        name: id.into(),
        parent: Some("bmc:/Chassis/1".into()),
        quantity,
        value,
        unit: String::new(),
        location: None,
        point: None,
        thresholds: Vec::new(),
        state: None,
        scope: Scope::Auto,
    }
}

/// (metric, hw.type) of each sample with hw.id `id`.
fn routed(samples: &[Sample], id: &str) -> Vec<(&'static str, String)> {
    samples
        .iter()
        .filter(|s| s.attr("hw.id") == Some(id))
        .map(|s| {
            (
                s.metric.desc().name,
                s.attr("hw.type").unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[test]
fn power_goes_where_no_sum_counts_it_twice() {
    let gpu = Component {
        id: "GPU-1".into(),
        hw_type: "gpu".into(),
        name: "GPU 0".into(),
        parent: None,
        model: None,
        serial: None,
        health: Some(Level::Warning),
    };
    let mut host = reading("host", "power", Quantity::Power, 2400.0);
    host.scope = Scope::Host;
    let mut avg = reading("avg", "power", Quantity::Power, 2300.0);
    avg.scope = Scope::Aside;
    let psu_in = reading("psu", "power_supply", Quantity::Power, 1210.0);
    let mut psu_out = reading("psu-out", "power_supply", Quantity::Power, 1150.0);
    psu_out.scope = Scope::SupplyOutput;
    let mut copy = reading("gpu-copy", "power", Quantity::Power, 455.0);
    copy.parent = Some("GPU-1".into());
    let mut by_context = reading("gpu-ctx", "power", Quantity::Power, 71.0);
    by_context.location = Some("gpu".into());
    let mut cpu = reading("cpu", "power", Quantity::Power, 180.0);
    cpu.location = Some("cpu".into());
    let mut hsc = reading("hsc", "power", Quantity::Power, 72.0);
    hsc.location = Some("gpu_subsystem".into());
    let mut gpu_energy = reading("gpu-energy", "energy", Quantity::Energy, 5.6e7);
    gpu_energy.location = Some("gpu".into());
    let poll = Poll {
        target: "bmc".into(),
        components: vec![gpu],
        readings: vec![
            host, avg, psu_in, psu_out, copy, by_context, cpu, hsc, gpu_energy,
        ],
        notes: Vec::new(),
        host: None,
    };
    let s = poll.samples();
    let one = |id: &str| routed(&s, id);
    assert_eq!(one("host"), [("hw.host.power", "enclosure".into())]);
    assert_eq!(one("avg"), [("bmc.power", "power".into())]);
    assert_eq!(one("psu"), [("bmc.power", "power_supply".into())]);
    assert_eq!(
        one("psu-out"),
        [("hw.power_supply.usage", "power_supply".into())]
    );
    assert_eq!(one("gpu-copy"), [("bmc.power", "gpu".into())]);
    assert_eq!(one("gpu-ctx"), [("bmc.power", "gpu".into())]);
    assert_eq!(one("cpu"), [("hw.power", "cpu".into())]);
    assert_eq!(one("hsc"), [("bmc.power", "power".into())]);
    assert_eq!(one("gpu-energy"), [("bmc.energy", "gpu".into())]);
    // The GPU's own hw.status is Junction's: the BMC's view is a metric of its own.
    let gpu: Vec<_> = routed(&s, "GPU-1").into_iter().map(|(m, _)| m).collect();
    assert!(!gpu.contains(&"hw.status"), "{gpu:?}");
    assert_eq!(
        s.iter()
            .filter(|x| x.metric == Metric::ComponentHealth && x.value == 1.0)
            .filter_map(|x| x.attr("bmc.health"))
            .collect::<Vec<_>>(),
        ["warning"]
    );
}

/// A GPU's T.Limit sensor as a DGX's BMC publishes it (a temperature in Cel, thresholds
/// LowerCaution 0, LowerCritical -2, LowerFatal -8) is a margin: not a temperature, not
/// the host's ambient; and a BMC that puts every sensor at the air intake is taken at its
/// sensors' names for the ambient.
#[test]
fn a_t_limit_sensor_is_a_margin_and_an_all_intake_bmc_is_read_by_name() {
    let mut tlimit = reading("tl", "temperature", Quantity::Temperature, 55.0);
    tlimit.thresholds = vec![
        ("lower_caution", 0.0),
        ("lower_critical", -2.0),
        ("lower_fatal", -8.0),
    ];
    tlimit.location = Some("intake".into());
    tlimit.state = Reading::level(55.0, &tlimit.thresholds, None);
    let mut freeze = reading("cold", "temperature", Quantity::Temperature, 20.0);
    freeze.thresholds = vec![("lower_caution", 0.0)];
    assert!(is_thermal_margin(&tlimit));
    assert!(
        !is_thermal_margin(&freeze),
        "a 0 °C low alarm is a temperature's"
    );
    let mut readings = vec![tlimit];
    for i in 0..10 {
        let mut r = reading(
            &format!("retimer{i}"),
            "temperature",
            Quantity::Temperature,
            58.0,
        );
        r.location = Some("intake".into());
        readings.push(r);
    }
    for (name, v) in [("TEMP_AMBIENT", 22.0), ("TEMP_MB_INLET", 25.0)] {
        let mut r = reading(name, "temperature", Quantity::Temperature, v);
        r.location = Some("intake".into());
        readings.push(r);
    }
    let poll = Poll {
        target: "bmc".into(),
        components: Vec::new(),
        readings,
        notes: Vec::new(),
        host: Some("bmc".into()),
    };
    let s = poll.samples();
    let of = |id: &str| -> Vec<Metric> {
        s.iter()
            .filter(|x| x.attr("hw.id") == Some(id))
            .map(|x| x.metric)
            .collect()
    };
    let tl = of("tl");
    assert!(tl.contains(&Metric::SensorReading), "{tl:?}");
    assert!(!tl.contains(&Metric::Temperature) && !tl.contains(&Metric::TemperatureLimit));
    assert!(
        tl.contains(&Metric::SensorThreshold),
        "its thresholds are kept"
    );
    let ambient: Vec<_> = s
        .iter()
        .filter(|x| x.metric == Metric::HostAmbient)
        .map(|x| (x.attr("hw.name").unwrap_or(""), x.value))
        .collect();
    assert_eq!(ambient, [("TEMP_AMBIENT", 22.0)]);
}

#[test]
fn temperatures_voltages_and_fans_carry_the_conventions_state_and_limits() {
    let mut t = reading("t", "temperature", Quantity::Temperature, 85.0);
    t.thresholds = vec![
        ("lower_critical", 5.0),
        ("upper_caution", 80.0),
        ("upper_critical", 90.0),
        ("upper_fatal", 95.0),
    ];
    t.state = Reading::level(85.0, &t.thresholds, None);
    let mut flow = reading("f", "flow", Quantity::Flow, 20.0);
    flow.thresholds = vec![("lower_caution", 30.0)];
    flow.state = Some(Level::Warning);
    let poll = Poll {
        target: "bmc".into(),
        components: Vec::new(),
        readings: vec![t, flow],
        notes: Vec::new(),
        host: Some("bmc".into()),
    };
    let s = poll.samples();
    let limits: Vec<_> = s
        .iter()
        .filter(|x| x.metric == Metric::TemperatureLimit)
        .map(|x| (x.attr("hw.limit_type").unwrap_or(""), x.value))
        .collect();
    assert_eq!(
        limits,
        [
            ("low.critical", 5.0),
            ("high.degraded", 80.0),
            ("high.critical", 90.0),
            ("high.fatal", 95.0)
        ]
    );
    let state = |id: &str, m: Metric, key: &str| -> Vec<String> {
        s.iter()
            .filter(|x| x.metric == m && x.attr("hw.id") == Some(id) && x.value == 1.0)
            .filter_map(|x| x.attr(key).map(str::to_string))
            .collect()
    };
    assert_eq!(state("t", Metric::Status, "hw.state"), ["degraded"]);
    assert!(state("t", Metric::SensorState, "bmc.sensor.state").is_empty());
    // The host's heating margin: 80 − 85, the sensor past its caution threshold.
    let margin: Vec<_> = s
        .iter()
        .filter(|x| x.metric == Metric::HostHeatingMargin)
        .map(|x| (x.attr("hw.id").unwrap_or(""), x.value))
        .collect();
    assert_eq!(margin, [("bmc", -5.0)]);
    // Flow has no family in the conventions: it keeps Junction's own.
    assert_eq!(
        state("f", Metric::SensorState, "bmc.sensor.state"),
        ["warning"]
    );
    assert!(state("f", Metric::Status, "hw.state").is_empty());
}

#[test]
fn snake_case() {
    assert_eq!(snake("LiquidInlet"), "liquid_inlet");
    assert_eq!(snake("GPU"), "gpu");
    assert_eq!(snake("GPUSubsystem"), "gpu_subsystem");
    assert_eq!(snake("Intake"), "intake");
}
