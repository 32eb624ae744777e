from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TensorType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    Float16: _ClassVar[TensorType]
    Float32: _ClassVar[TensorType]
    Float64: _ClassVar[TensorType]
    Int8: _ClassVar[TensorType]
    Int16: _ClassVar[TensorType]
    Int32: _ClassVar[TensorType]
    Int64: _ClassVar[TensorType]
    String: _ClassVar[TensorType]
    Bool: _ClassVar[TensorType]
    Bytes: _ClassVar[TensorType]

class LogLevel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NONE: _ClassVar[LogLevel]
    FULL: _ClassVar[LogLevel]
    SAMPLE: _ClassVar[LogLevel]

class MetricOrdering(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DESC: _ClassVar[MetricOrdering]
    ASC: _ClassVar[MetricOrdering]
Float16: TensorType
Float32: TensorType
Float64: TensorType
Int8: TensorType
Int16: TensorType
Int32: TensorType
Int64: TensorType
String: TensorType
Bool: TensorType
Bytes: TensorType
NONE: LogLevel
FULL: LogLevel
SAMPLE: LogLevel
DESC: MetricOrdering
ASC: MetricOrdering

class Contract(_message.Message):
    __slots__ = ("organization", "project", "contract_number")
    ORGANIZATION_FIELD_NUMBER: _ClassVar[int]
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    CONTRACT_NUMBER_FIELD_NUMBER: _ClassVar[int]
    organization: str
    project: str
    contract_number: int
    def __init__(self, organization: _Optional[str] = ..., project: _Optional[str] = ..., contract_number: _Optional[int] = ...) -> None: ...

class FQRV(_message.Message):
    __slots__ = ("contract", "release_version")
    CONTRACT_FIELD_NUMBER: _ClassVar[int]
    RELEASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    contract: Contract
    release_version: str
    def __init__(self, contract: _Optional[_Union[Contract, _Mapping]] = ..., release_version: _Optional[str] = ...) -> None: ...

class StringData(_message.Message):
    __slots__ = ("data", "tensorType")
    DATA_FIELD_NUMBER: _ClassVar[int]
    TENSORTYPE_FIELD_NUMBER: _ClassVar[int]
    data: _containers.RepeatedScalarFieldContainer[str]
    tensorType: TensorType
    def __init__(self, data: _Optional[_Iterable[str]] = ..., tensorType: _Optional[_Union[TensorType, str]] = ...) -> None: ...

class Int8Data(_message.Message):
    __slots__ = ("data", "tensorType")
    DATA_FIELD_NUMBER: _ClassVar[int]
    TENSORTYPE_FIELD_NUMBER: _ClassVar[int]
    data: _containers.RepeatedScalarFieldContainer[int]
    tensorType: TensorType
    def __init__(self, data: _Optional[_Iterable[int]] = ..., tensorType: _Optional[_Union[TensorType, str]] = ...) -> None: ...

class Int16Data(_message.Message):
    __slots__ = ("data", "tensorType")
    DATA_FIELD_NUMBER: _ClassVar[int]
    TENSORTYPE_FIELD_NUMBER: _ClassVar[int]
    data: _containers.RepeatedScalarFieldContainer[int]
    tensorType: TensorType
    def __init__(self, data: _Optional[_Iterable[int]] = ..., tensorType: _Optional[_Union[TensorType, str]] = ...) -> None: ...

class Int32Data(_message.Message):
    __slots__ = ("data", "tensorType")
    DATA_FIELD_NUMBER: _ClassVar[int]
    TENSORTYPE_FIELD_NUMBER: _ClassVar[int]
    data: _containers.RepeatedScalarFieldContainer[int]
    tensorType: TensorType
    def __init__(self, data: _Optional[_Iterable[int]] = ..., tensorType: _Optional[_Union[TensorType, str]] = ...) -> None: ...

class Int64Data(_message.Message):
    __slots__ = ("data", "tensorType")
    DATA_FIELD_NUMBER: _ClassVar[int]
    TENSORTYPE_FIELD_NUMBER: _ClassVar[int]
    data: _containers.RepeatedScalarFieldContainer[int]
    tensorType: TensorType
    def __init__(self, data: _Optional[_Iterable[int]] = ..., tensorType: _Optional[_Union[TensorType, str]] = ...) -> None: ...

class Float16Data(_message.Message):
    __slots__ = ("data", "tensorType")
    DATA_FIELD_NUMBER: _ClassVar[int]
    TENSORTYPE_FIELD_NUMBER: _ClassVar[int]
    data: _containers.RepeatedScalarFieldContainer[float]
    tensorType: TensorType
    def __init__(self, data: _Optional[_Iterable[float]] = ..., tensorType: _Optional[_Union[TensorType, str]] = ...) -> None: ...

class Float32Data(_message.Message):
    __slots__ = ("data", "tensorType")
    DATA_FIELD_NUMBER: _ClassVar[int]
    TENSORTYPE_FIELD_NUMBER: _ClassVar[int]
    data: _containers.RepeatedScalarFieldContainer[float]
    tensorType: TensorType
    def __init__(self, data: _Optional[_Iterable[float]] = ..., tensorType: _Optional[_Union[TensorType, str]] = ...) -> None: ...

class Float64Data(_message.Message):
    __slots__ = ("data", "tensorType")
    DATA_FIELD_NUMBER: _ClassVar[int]
    TENSORTYPE_FIELD_NUMBER: _ClassVar[int]
    data: _containers.RepeatedScalarFieldContainer[float]
    tensorType: TensorType
    def __init__(self, data: _Optional[_Iterable[float]] = ..., tensorType: _Optional[_Union[TensorType, str]] = ...) -> None: ...

class BoolData(_message.Message):
    __slots__ = ("data", "tensorType")
    DATA_FIELD_NUMBER: _ClassVar[int]
    TENSORTYPE_FIELD_NUMBER: _ClassVar[int]
    data: _containers.RepeatedScalarFieldContainer[bool]
    tensorType: TensorType
    def __init__(self, data: _Optional[_Iterable[bool]] = ..., tensorType: _Optional[_Union[TensorType, str]] = ...) -> None: ...

class ByteData(_message.Message):
    __slots__ = ("data", "tensorType")
    DATA_FIELD_NUMBER: _ClassVar[int]
    TENSORTYPE_FIELD_NUMBER: _ClassVar[int]
    data: _containers.RepeatedScalarFieldContainer[bytes]
    tensorType: TensorType
    def __init__(self, data: _Optional[_Iterable[bytes]] = ..., tensorType: _Optional[_Union[TensorType, str]] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("String", "Int8", "Int16", "Int32", "Int64", "Float16", "Float32", "Float64", "Bool", "Byte")
    STRING_FIELD_NUMBER: _ClassVar[int]
    INT8_FIELD_NUMBER: _ClassVar[int]
    INT16_FIELD_NUMBER: _ClassVar[int]
    INT32_FIELD_NUMBER: _ClassVar[int]
    INT64_FIELD_NUMBER: _ClassVar[int]
    FLOAT16_FIELD_NUMBER: _ClassVar[int]
    FLOAT32_FIELD_NUMBER: _ClassVar[int]
    FLOAT64_FIELD_NUMBER: _ClassVar[int]
    BOOL_FIELD_NUMBER: _ClassVar[int]
    BYTE_FIELD_NUMBER: _ClassVar[int]
    String: StringData
    Int8: Int8Data
    Int16: Int16Data
    Int32: Int32Data
    Int64: Int64Data
    Float16: Float16Data
    Float32: Float32Data
    Float64: Float64Data
    Bool: BoolData
    Byte: ByteData
    def __init__(self, String: _Optional[_Union[StringData, _Mapping]] = ..., Int8: _Optional[_Union[Int8Data, _Mapping]] = ..., Int16: _Optional[_Union[Int16Data, _Mapping]] = ..., Int32: _Optional[_Union[Int32Data, _Mapping]] = ..., Int64: _Optional[_Union[Int64Data, _Mapping]] = ..., Float16: _Optional[_Union[Float16Data, _Mapping]] = ..., Float32: _Optional[_Union[Float32Data, _Mapping]] = ..., Float64: _Optional[_Union[Float64Data, _Mapping]] = ..., Bool: _Optional[_Union[BoolData, _Mapping]] = ..., Byte: _Optional[_Union[ByteData, _Mapping]] = ...) -> None: ...

class TensorSchema(_message.Message):
    __slots__ = ("type", "fields")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    type: TensorType
    fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, type: _Optional[_Union[TensorType, str]] = ..., fields: _Optional[_Iterable[str]] = ...) -> None: ...

class Datum(_message.Message):
    __slots__ = ("tensors",)
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[Tensor]
    def __init__(self, tensors: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ...) -> None: ...

class InferenceRequest(_message.Message):
    __slots__ = ("schema", "datum", "configs")
    class ConfigsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    DATUM_FIELD_NUMBER: _ClassVar[int]
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    schema: _containers.RepeatedCompositeFieldContainer[TensorSchema]
    datum: _containers.RepeatedCompositeFieldContainer[Datum]
    configs: _containers.ScalarMap[str, str]
    def __init__(self, schema: _Optional[_Iterable[_Union[TensorSchema, _Mapping]]] = ..., datum: _Optional[_Iterable[_Union[Datum, _Mapping]]] = ..., configs: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Prediction(_message.Message):
    __slots__ = ("fqrv", "schema", "datum")
    FQRV_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    DATUM_FIELD_NUMBER: _ClassVar[int]
    fqrv: FQRV
    schema: _containers.RepeatedCompositeFieldContainer[TensorSchema]
    datum: _containers.RepeatedCompositeFieldContainer[Datum]
    def __init__(self, fqrv: _Optional[_Union[FQRV, _Mapping]] = ..., schema: _Optional[_Iterable[_Union[TensorSchema, _Mapping]]] = ..., datum: _Optional[_Iterable[_Union[Datum, _Mapping]]] = ...) -> None: ...

class ImmediatelyValid(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NeverValid(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TimeBasedValidity(_message.Message):
    __slots__ = ("validAfterMS",)
    VALIDAFTERMS_FIELD_NUMBER: _ClassVar[int]
    validAfterMS: int
    def __init__(self, validAfterMS: _Optional[int] = ...) -> None: ...

class PerformanceBasedValidity(_message.Message):
    __slots__ = ("minThreshold", "metricName")
    MINTHRESHOLD_FIELD_NUMBER: _ClassVar[int]
    METRICNAME_FIELD_NUMBER: _ClassVar[int]
    minThreshold: float
    metricName: str
    def __init__(self, minThreshold: _Optional[float] = ..., metricName: _Optional[str] = ...) -> None: ...

class MinServedEventsBasedValidity(_message.Message):
    __slots__ = ("validAfterMinServedEvents",)
    VALIDAFTERMINSERVEDEVENTS_FIELD_NUMBER: _ClassVar[int]
    validAfterMinServedEvents: int
    def __init__(self, validAfterMinServedEvents: _Optional[int] = ...) -> None: ...

class ValidityRuleShim(_message.Message):
    __slots__ = ("ImmediatelyValid", "NeverValid", "TimeBasedValidity", "PerformanceBasedValidity", "MinServedEventsBasedValidity")
    IMMEDIATELYVALID_FIELD_NUMBER: _ClassVar[int]
    NEVERVALID_FIELD_NUMBER: _ClassVar[int]
    TIMEBASEDVALIDITY_FIELD_NUMBER: _ClassVar[int]
    PERFORMANCEBASEDVALIDITY_FIELD_NUMBER: _ClassVar[int]
    MINSERVEDEVENTSBASEDVALIDITY_FIELD_NUMBER: _ClassVar[int]
    ImmediatelyValid: ImmediatelyValid
    NeverValid: NeverValid
    TimeBasedValidity: TimeBasedValidity
    PerformanceBasedValidity: PerformanceBasedValidity
    MinServedEventsBasedValidity: MinServedEventsBasedValidity
    def __init__(self, ImmediatelyValid: _Optional[_Union[ImmediatelyValid, _Mapping]] = ..., NeverValid: _Optional[_Union[NeverValid, _Mapping]] = ..., TimeBasedValidity: _Optional[_Union[TimeBasedValidity, _Mapping]] = ..., PerformanceBasedValidity: _Optional[_Union[PerformanceBasedValidity, _Mapping]] = ..., MinServedEventsBasedValidity: _Optional[_Union[MinServedEventsBasedValidity, _Mapping]] = ...) -> None: ...

class ImmediatePhaseIn(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LinearTimeBasedPhaseIn(_message.Message):
    __slots__ = ("phase_in_over_secs",)
    PHASE_IN_OVER_SECS_FIELD_NUMBER: _ClassVar[int]
    phase_in_over_secs: int
    def __init__(self, phase_in_over_secs: _Optional[int] = ...) -> None: ...

class PhaseInPolicyShim(_message.Message):
    __slots__ = ("ImmediatePhaseIn", "LinearTimeBasedPhaseIn")
    IMMEDIATEPHASEIN_FIELD_NUMBER: _ClassVar[int]
    LINEARTIMEBASEDPHASEIN_FIELD_NUMBER: _ClassVar[int]
    ImmediatePhaseIn: ImmediatePhaseIn
    LinearTimeBasedPhaseIn: LinearTimeBasedPhaseIn
    def __init__(self, ImmediatePhaseIn: _Optional[_Union[ImmediatePhaseIn, _Mapping]] = ..., LinearTimeBasedPhaseIn: _Optional[_Union[LinearTimeBasedPhaseIn, _Mapping]] = ...) -> None: ...

class PolicySettings(_message.Message):
    __slots__ = ("validityPolicy", "phaseInPolicy")
    VALIDITYPOLICY_FIELD_NUMBER: _ClassVar[int]
    PHASEINPOLICY_FIELD_NUMBER: _ClassVar[int]
    validityPolicy: _containers.RepeatedCompositeFieldContainer[ValidityRuleShim]
    phaseInPolicy: PhaseInPolicyShim
    def __init__(self, validityPolicy: _Optional[_Iterable[_Union[ValidityRuleShim, _Mapping]]] = ..., phaseInPolicy: _Optional[_Union[PhaseInPolicyShim, _Mapping]] = ...) -> None: ...

class LoggingSettings(_message.Message):
    __slots__ = ("logLevel", "keyFeatures", "keyFeaturesSeparator")
    LOGLEVEL_FIELD_NUMBER: _ClassVar[int]
    KEYFEATURES_FIELD_NUMBER: _ClassVar[int]
    KEYFEATURESSEPARATOR_FIELD_NUMBER: _ClassVar[int]
    logLevel: LogLevel
    keyFeatures: _containers.RepeatedScalarFieldContainer[str]
    keyFeaturesSeparator: str
    def __init__(self, logLevel: _Optional[_Union[LogLevel, str]] = ..., keyFeatures: _Optional[_Iterable[str]] = ..., keyFeaturesSeparator: _Optional[str] = ...) -> None: ...

class ServableSettings(_message.Message):
    __slots__ = ("policySettings", "loggingSettings")
    POLICYSETTINGS_FIELD_NUMBER: _ClassVar[int]
    LOGGINGSETTINGS_FIELD_NUMBER: _ClassVar[int]
    policySettings: PolicySettings
    loggingSettings: LoggingSettings
    def __init__(self, policySettings: _Optional[_Union[PolicySettings, _Mapping]] = ..., loggingSettings: _Optional[_Union[LoggingSettings, _Mapping]] = ...) -> None: ...

class KeepLatest(_message.Message):
    __slots__ = ("servablesToKeep",)
    SERVABLESTOKEEP_FIELD_NUMBER: _ClassVar[int]
    servablesToKeep: int
    def __init__(self, servablesToKeep: _Optional[int] = ...) -> None: ...

class KeepTopRanked(_message.Message):
    __slots__ = ("servablesToKeep", "metricToEvaluate", "ordering")
    SERVABLESTOKEEP_FIELD_NUMBER: _ClassVar[int]
    METRICTOEVALUATE_FIELD_NUMBER: _ClassVar[int]
    ORDERING_FIELD_NUMBER: _ClassVar[int]
    servablesToKeep: int
    metricToEvaluate: str
    ordering: MetricOrdering
    def __init__(self, servablesToKeep: _Optional[int] = ..., metricToEvaluate: _Optional[str] = ..., ordering: _Optional[_Union[MetricOrdering, str]] = ...) -> None: ...

class ExpirationPolicyShim(_message.Message):
    __slots__ = ("KeepLatest", "KeepTopRanked")
    KEEPLATEST_FIELD_NUMBER: _ClassVar[int]
    KEEPTOPRANKED_FIELD_NUMBER: _ClassVar[int]
    KeepLatest: KeepLatest
    KeepTopRanked: KeepTopRanked
    def __init__(self, KeepLatest: _Optional[_Union[KeepLatest, _Mapping]] = ..., KeepTopRanked: _Optional[_Union[KeepTopRanked, _Mapping]] = ...) -> None: ...

class FairPhaseInPctBasedRouter(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LatestPhaseInPctBasedRouter(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RouterTypeShim(_message.Message):
    __slots__ = ("FairPhaseInPctBasedRouter", "LatestPhaseInPctBasedRouter")
    FAIRPHASEINPCTBASEDROUTER_FIELD_NUMBER: _ClassVar[int]
    LATESTPHASEINPCTBASEDROUTER_FIELD_NUMBER: _ClassVar[int]
    FairPhaseInPctBasedRouter: FairPhaseInPctBasedRouter
    LatestPhaseInPctBasedRouter: LatestPhaseInPctBasedRouter
    def __init__(self, FairPhaseInPctBasedRouter: _Optional[_Union[FairPhaseInPctBasedRouter, _Mapping]] = ..., LatestPhaseInPctBasedRouter: _Optional[_Union[LatestPhaseInPctBasedRouter, _Mapping]] = ...) -> None: ...

class ContractSettings(_message.Message):
    __slots__ = ("expirationPolicy", "router")
    EXPIRATIONPOLICY_FIELD_NUMBER: _ClassVar[int]
    ROUTER_FIELD_NUMBER: _ClassVar[int]
    expirationPolicy: ExpirationPolicyShim
    router: RouterTypeShim
    def __init__(self, expirationPolicy: _Optional[_Union[ExpirationPolicyShim, _Mapping]] = ..., router: _Optional[_Union[RouterTypeShim, _Mapping]] = ...) -> None: ...

class H2OMojo(_message.Message):
    __slots__ = ("mojoPath", "version")
    MOJOPATH_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    mojoPath: str
    version: str
    def __init__(self, mojoPath: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class PythonFlavor(_message.Message):
    __slots__ = ("modulePath", "entryPoint")
    MODULEPATH_FIELD_NUMBER: _ClassVar[int]
    ENTRYPOINT_FIELD_NUMBER: _ClassVar[int]
    modulePath: str
    entryPoint: str
    def __init__(self, modulePath: _Optional[str] = ..., entryPoint: _Optional[str] = ...) -> None: ...

class FlavorShim(_message.Message):
    __slots__ = ("H2OMojo", "Python")
    H2OMOJO_FIELD_NUMBER: _ClassVar[int]
    PYTHON_FIELD_NUMBER: _ClassVar[int]
    H2OMojo: H2OMojo
    Python: PythonFlavor
    def __init__(self, H2OMojo: _Optional[_Union[H2OMojo, _Mapping]] = ..., Python: _Optional[_Union[PythonFlavor, _Mapping]] = ...) -> None: ...

class BasicServeRequest(_message.Message):
    __slots__ = ("path", "fqrv", "servableSettings", "contractSettings", "tags", "flavor")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PATH_FIELD_NUMBER: _ClassVar[int]
    FQRV_FIELD_NUMBER: _ClassVar[int]
    SERVABLESETTINGS_FIELD_NUMBER: _ClassVar[int]
    CONTRACTSETTINGS_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    FLAVOR_FIELD_NUMBER: _ClassVar[int]
    path: str
    fqrv: FQRV
    servableSettings: ServableSettings
    contractSettings: ContractSettings
    tags: _containers.ScalarMap[str, str]
    flavor: FlavorShim
    def __init__(self, path: _Optional[str] = ..., fqrv: _Optional[_Union[FQRV, _Mapping]] = ..., servableSettings: _Optional[_Union[ServableSettings, _Mapping]] = ..., contractSettings: _Optional[_Union[ContractSettings, _Mapping]] = ..., tags: _Optional[_Mapping[str, str]] = ..., flavor: _Optional[_Union[FlavorShim, _Mapping]] = ...) -> None: ...

class MLFlowServeRequest(_message.Message):
    __slots__ = ("path", "fqrv", "servableSettings", "contractSettings", "tags")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PATH_FIELD_NUMBER: _ClassVar[int]
    FQRV_FIELD_NUMBER: _ClassVar[int]
    SERVABLESETTINGS_FIELD_NUMBER: _ClassVar[int]
    CONTRACTSETTINGS_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    path: str
    fqrv: FQRV
    servableSettings: ServableSettings
    contractSettings: ContractSettings
    tags: _containers.ScalarMap[str, str]
    def __init__(self, path: _Optional[str] = ..., fqrv: _Optional[_Union[FQRV, _Mapping]] = ..., servableSettings: _Optional[_Union[ServableSettings, _Mapping]] = ..., contractSettings: _Optional[_Union[ContractSettings, _Mapping]] = ..., tags: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ServeRequest(_message.Message):
    __slots__ = ("Basic", "MLFlow")
    BASIC_FIELD_NUMBER: _ClassVar[int]
    MLFLOW_FIELD_NUMBER: _ClassVar[int]
    Basic: BasicServeRequest
    MLFlow: MLFlowServeRequest
    def __init__(self, Basic: _Optional[_Union[BasicServeRequest, _Mapping]] = ..., MLFlow: _Optional[_Union[MLFlowServeRequest, _Mapping]] = ...) -> None: ...

class ServableMetrics(_message.Message):
    __slots__ = ("fqrv", "scoreCount", "shadeCount", "createdAtMS", "performanceMetrics", "becameValidAtMS", "currentPhaseInPct")
    class PerformanceMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    FQRV_FIELD_NUMBER: _ClassVar[int]
    SCORECOUNT_FIELD_NUMBER: _ClassVar[int]
    SHADECOUNT_FIELD_NUMBER: _ClassVar[int]
    CREATEDATMS_FIELD_NUMBER: _ClassVar[int]
    PERFORMANCEMETRICS_FIELD_NUMBER: _ClassVar[int]
    BECAMEVALIDATMS_FIELD_NUMBER: _ClassVar[int]
    CURRENTPHASEINPCT_FIELD_NUMBER: _ClassVar[int]
    fqrv: FQRV
    scoreCount: int
    shadeCount: int
    createdAtMS: int
    performanceMetrics: _containers.ScalarMap[str, float]
    becameValidAtMS: int
    currentPhaseInPct: int
    def __init__(self, fqrv: _Optional[_Union[FQRV, _Mapping]] = ..., scoreCount: _Optional[int] = ..., shadeCount: _Optional[int] = ..., createdAtMS: _Optional[int] = ..., performanceMetrics: _Optional[_Mapping[str, float]] = ..., becameValidAtMS: _Optional[int] = ..., currentPhaseInPct: _Optional[int] = ...) -> None: ...

class BasicIOMetadata(_message.Message):
    __slots__ = ("name", "description", "shape", "type")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    type: TensorType
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., type: _Optional[_Union[TensorType, str]] = ...) -> None: ...

class BasicMetaData(_message.Message):
    __slots__ = ("fqrv", "name", "server", "description", "inputs", "outputs")
    FQRV_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SERVER_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    fqrv: FQRV
    name: str
    server: str
    description: str
    inputs: _containers.RepeatedCompositeFieldContainer[BasicIOMetadata]
    outputs: _containers.RepeatedCompositeFieldContainer[BasicIOMetadata]
    def __init__(self, fqrv: _Optional[_Union[FQRV, _Mapping]] = ..., name: _Optional[str] = ..., server: _Optional[str] = ..., description: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[BasicIOMetadata, _Mapping]]] = ..., outputs: _Optional[_Iterable[_Union[BasicIOMetadata, _Mapping]]] = ...) -> None: ...

class PredictionEvent(_message.Message):
    __slots__ = ("prediction", "servedRequest", "inferenceRequest", "loggingSettings", "eventTimeMS", "requestId", "fqrv", "latencyMs", "status", "error", "errorCode", "protocol", "wireRequest", "wireResponse", "wireRequestJsonLength", "wireResponseJsonLength", "traceId")
    PREDICTION_FIELD_NUMBER: _ClassVar[int]
    SERVEDREQUEST_FIELD_NUMBER: _ClassVar[int]
    INFERENCEREQUEST_FIELD_NUMBER: _ClassVar[int]
    LOGGINGSETTINGS_FIELD_NUMBER: _ClassVar[int]
    EVENTTIMEMS_FIELD_NUMBER: _ClassVar[int]
    REQUESTID_FIELD_NUMBER: _ClassVar[int]
    FQRV_FIELD_NUMBER: _ClassVar[int]
    LATENCYMS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERRORCODE_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    WIREREQUEST_FIELD_NUMBER: _ClassVar[int]
    WIRERESPONSE_FIELD_NUMBER: _ClassVar[int]
    WIREREQUESTJSONLENGTH_FIELD_NUMBER: _ClassVar[int]
    WIRERESPONSEJSONLENGTH_FIELD_NUMBER: _ClassVar[int]
    TRACEID_FIELD_NUMBER: _ClassVar[int]
    prediction: Prediction
    servedRequest: bool
    inferenceRequest: InferenceRequest
    loggingSettings: LoggingSettings
    eventTimeMS: int
    requestId: str
    fqrv: FQRV
    latencyMs: float
    status: int
    error: str
    errorCode: str
    protocol: str
    wireRequest: bytes
    wireResponse: bytes
    wireRequestJsonLength: int
    wireResponseJsonLength: int
    traceId: str
    def __init__(self, prediction: _Optional[_Union[Prediction, _Mapping]] = ..., servedRequest: _Optional[bool] = ..., inferenceRequest: _Optional[_Union[InferenceRequest, _Mapping]] = ..., loggingSettings: _Optional[_Union[LoggingSettings, _Mapping]] = ..., eventTimeMS: _Optional[int] = ..., requestId: _Optional[str] = ..., fqrv: _Optional[_Union[FQRV, _Mapping]] = ..., latencyMs: _Optional[float] = ..., status: _Optional[int] = ..., error: _Optional[str] = ..., errorCode: _Optional[str] = ..., protocol: _Optional[str] = ..., wireRequest: _Optional[bytes] = ..., wireResponse: _Optional[bytes] = ..., wireRequestJsonLength: _Optional[int] = ..., wireResponseJsonLength: _Optional[int] = ..., traceId: _Optional[str] = ...) -> None: ...

class PredictionGP(_message.Message):
    __slots__ = ("inferResponse", "fqrv")
    INFERRESPONSE_FIELD_NUMBER: _ClassVar[int]
    FQRV_FIELD_NUMBER: _ClassVar[int]
    inferResponse: bytes
    fqrv: FQRV
    def __init__(self, inferResponse: _Optional[bytes] = ..., fqrv: _Optional[_Union[FQRV, _Mapping]] = ...) -> None: ...

class PredictionEventGP(_message.Message):
    __slots__ = ("prediction", "servedRequest", "inferBytes", "loggingSettings", "eventTimeMS", "requestId", "fqrv", "latencyMs", "status", "error", "errorCode", "protocol", "traceId")
    PREDICTION_FIELD_NUMBER: _ClassVar[int]
    SERVEDREQUEST_FIELD_NUMBER: _ClassVar[int]
    INFERBYTES_FIELD_NUMBER: _ClassVar[int]
    LOGGINGSETTINGS_FIELD_NUMBER: _ClassVar[int]
    EVENTTIMEMS_FIELD_NUMBER: _ClassVar[int]
    REQUESTID_FIELD_NUMBER: _ClassVar[int]
    FQRV_FIELD_NUMBER: _ClassVar[int]
    LATENCYMS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERRORCODE_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    TRACEID_FIELD_NUMBER: _ClassVar[int]
    prediction: PredictionGP
    servedRequest: bool
    inferBytes: bytes
    loggingSettings: LoggingSettings
    eventTimeMS: int
    requestId: str
    fqrv: FQRV
    latencyMs: float
    status: int
    error: str
    errorCode: str
    protocol: str
    traceId: str
    def __init__(self, prediction: _Optional[_Union[PredictionGP, _Mapping]] = ..., servedRequest: _Optional[bool] = ..., inferBytes: _Optional[bytes] = ..., loggingSettings: _Optional[_Union[LoggingSettings, _Mapping]] = ..., eventTimeMS: _Optional[int] = ..., requestId: _Optional[str] = ..., fqrv: _Optional[_Union[FQRV, _Mapping]] = ..., latencyMs: _Optional[float] = ..., status: _Optional[int] = ..., error: _Optional[str] = ..., errorCode: _Optional[str] = ..., protocol: _Optional[str] = ..., traceId: _Optional[str] = ...) -> None: ...
