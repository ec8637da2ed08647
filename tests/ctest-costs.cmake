# ctest-costs.cmake — the longest GoogleTest tests' run times in seconds (a 2-core x86-64 VM,
# ctest -j2; the ASan build's figure where it is the larger), included by CTest after the
# discovered tests (tests/CMakeLists.txt). `ctest -j` starts tests in descending COST: without
# these, a fresh tree runs them in file order and the longest start last, leaving one core
# idle at the end. Once a tree has run, ctest's own timings (Testing/Temporary/
# CTestCostData.txt) take over. A name not in a build is ignored.
set_tests_properties(ModelFiles.CorruptionMatrixShard0 PROPERTIES COST 60)
set_tests_properties(ModelFiles.CorruptionMatrixShard1 PROPERTIES COST 53)
set_tests_properties(ReplayValidate.ReproducesRecordedTraces PROPERTIES COST 36)
set_tests_properties(SplitModels.SplitSetStreamsLikeTheMergedFile PROPERTIES COST 20)
set_tests_properties(IoFaults.ShortReadsAndEintrAreInvisible PROPERTIES COST 20)
set_tests_properties(CacheBudget.PoolWarmUpIsByteIdentical PROPERTIES COST 14)
set_tests_properties(RouteTraceRun.TracingNeverChangesTheOutputAndFailuresOnlyWarn PROPERTIES COST 14)
set_tests_properties(SubstReplayCli.EvalRecordsScoresToo PROPERTIES COST 13)
set_tests_properties(ModelFiles.MutatorRoundTripIsByteIdentical PROPERTIES COST 12)
set_tests_properties(ResidencyCache.RssStaysWithinBudgetProtected PROPERTIES COST 11)
set_tests_properties(SplitModels.LargeAlignmentStreamsOnEveryRun PROPERTIES COST 11)
